"""The parts behind tests/sandbox/sandbox.py (the CLI and the `Sandbox` class)."""
