"""mtp-operator: reconciles MTPInference resources into per-GPU-model vLLM pools."""

__version__ = "0.1.0"
