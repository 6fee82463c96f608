"""The thin top: kopf handlers and the `mtp-operator run` process that wires the loops."""
