"""The simulated GPU nodes (tests/sandbox/nodes.yaml) as Node objects for kwok."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sandbox_lib.common import NODES_YAML


def node_objects(nodes_file: Path = NODES_YAML) -> list[dict[str, Any]]:
    """The Node objects described by nodes.yaml (see the comments in that file)."""
    spec = yaml.safe_load(nodes_file.read_text())
    defaults = spec.get("defaults", {})
    nodes = []
    for pool in spec["pools"]:
        for i in range(int(pool.get("count", 1))):
            name = f"{pool['prefix']}-{i}"
            labels = {**defaults.get("labels", {}), **pool.get("labels", {})}
            labels["kubernetes.io/hostname"] = name
            resources = {
                "cpu": str(pool.get("cpu", defaults.get("cpu", "64"))),
                "memory": str(pool.get("memory", defaults.get("memory", "512Gi"))),
                "pods": str(pool.get("pods", defaults.get("pods", "110"))),
            }
            if pool.get("product"):
                gpus = str(pool.get("gpus", 8))
                labels.update(
                    {
                        "nvidia.com/gpu.present": "true",
                        "nvidia.com/gpu.product": pool["product"],
                        "nvidia.com/gpu.count": gpus,
                        "nvidia.com/gpu.memory": str(pool["memoryMiB"]),
                        "nvidia.com/gpu.family": pool["family"],
                    }
                )
                if "compute" in pool:
                    major, minor = str(pool["compute"]).split(".")
                    labels["nvidia.com/gpu.compute.major"] = major
                    labels["nvidia.com/gpu.compute.minor"] = minor
                resources["nvidia.com/gpu"] = gpus
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {
                        **defaults.get("annotations", {}),
                        **pool.get("annotations", {}),
                    },
                },
                "spec": {"taints": pool["taints"]} if pool.get("taints") else {},
                "status": {"capacity": resources, "allocatable": dict(resources)},
            }
            nodes.append(node)
    return nodes


# ---------------------------------------------------------------------------------- sandbox
