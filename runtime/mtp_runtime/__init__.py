"""mtp-runtime: the in-pod launcher and MTP metrics exporter for vLLM with MTP speculation."""

__version__ = "0.1.0"
# The vLLM release whose flags, methods and metric names this runtime follows.
VLLM_VERSION = "0.33.0"
