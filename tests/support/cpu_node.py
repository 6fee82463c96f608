"""The real node as a one-GPU node for pool pods that run the CPU runtime image.

The real node stands in for a GPU node the way the operator sees one: a `nvidia.com/gpu.product`
label and `nvidia.com/gpu` capacity, advertised through the node's status as an extended
resource (no device plugin). The image sets MTP_RUNTIME_DEVICE=cpu, so the runtime takes the
GPU from the pool configuration and runs the CPU engine.
"""

from __future__ import annotations

PRODUCT = "CPU-VLLM"
PORTS = (8000, 9400)  # the pool's http and metrics ports, on the node (hostNetwork)

