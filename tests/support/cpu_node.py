"""The real node as a one-GPU node for pool pods that run the CPU runtime image.

The real node stands in for a GPU node the way the operator sees one: a `nvidia.com/gpu.product`
label and `nvidia.com/gpu` capacity, advertised through the node's status as an extended
resource (no device plugin). The image sets MTP_RUNTIME_DEVICE=cpu, so the runtime takes the
GPU from the pool configuration and runs the CPU engine.
"""

from __future__ import annotations

PRODUCT = "CPU-VLLM"
PORTS = (8000, 9400)  # the pool's http and metrics ports, on the node (hostNetwork)



def make_gpu_node(kubectl, node, gpus: int = 1) -> None:
    """Labels the real node `node` with PRODUCT and advertises `gpus` nvidia.com/gpu in its
    status (kubectl: the tests' runner); waits until its allocatable shows them."""
    import json
    import time

    kubectl("label", "node", node.name, f"nvidia.com/gpu.product={PRODUCT}", "--overwrite")
    patch = {"status": {"capacity": {"nvidia.com/gpu": str(gpus)}}}
    kubectl("patch", "node", node.name, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = json.loads(kubectl("get", "node", node.name, "-o", "json").stdout)
        if out["status"]["allocatable"].get("nvidia.com/gpu") == str(gpus):
            return
        time.sleep(0.25)
    raise TimeoutError(f"node {node.name}: allocatable nvidia.com/gpu {gpus} not within 30 s")


def unmake_gpu_node(kubectl, node) -> None:
    """Takes make_gpu_node's label and capacity off again."""
    import json

    kubectl("label", "node", node.name, "nvidia.com/gpu.product-", check=False)
    kubectl("patch", "node", node.name, "--subresource=status", "--type=json", "-p",
            json.dumps([{"op": "remove", "path": "/status/capacity/nvidia.com~1gpu"}]),
            check=False)
