"""The reaction benchmark's shared parts (bench/reaction/reaction.py): the pool Deployment
watch that times each change, summaries, and the sandbox cluster helpers."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient
from lightkube.resources.apps_v1 import Deployment

from support.pool_fakes import LABEL_RESOURCE, deployment_k

PRODUCTS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-L40S")
TOKEN = "bench-reaction-token"
HEALTHY, BROKEN = 0.95, 0.0
SANDBOX_NODES = "kwok: 2xA100, 2xH100, 2xL40S, 1xH200 (8 GPUs each) + 1 CPU node"


# ---- measuring ------------------------------------------------------------------------------


@dataclass
class Watched:
    """The K of every pool Deployment in a namespace, kept current by a watch."""

    k: dict[tuple[str, str], int] = field(default_factory=dict)  # (resource, product) -> K
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    seen: dict[tuple[str, str, int], float] = field(default_factory=dict)  # first time at K

    async def record(self, dep: Any) -> None:
        d = dep.to_dict()
        meta = d["metadata"]
        product = (meta.get("annotations") or {}).get("mtp-operator.io/gpu-product")
        resource = (meta.get("labels") or {}).get(LABEL_RESOURCE)
        k = deployment_k(d)
        if not product or not resource or k is None:
            return
        now = time.monotonic()
        async with self.cond:
            self.k[(resource, product)] = k
            self.seen.setdefault((resource, product, k), now)
            self.cond.notify_all()

    async def wait_k(self, pool: tuple[str, str], k: int) -> float:
        """Monotonic time the watch first delivered `pool` at K `k`."""
        async with self.cond:
            await self.cond.wait_for(lambda: (*pool, k) in self.seen)
            return self.seen[(*pool, k)]


async def watch_pools(client: AsyncClient, namespace: str, watched: Watched) -> None:
    labels = {LABEL_RESOURCE: None}
    listing = client.list(Deployment, namespace=namespace, labels=labels)
    async for dep in listing:
        await watched.record(dep)
    version = listing.resourceVersion
    while True:
        try:
            async for _kind, dep in client.watch(Deployment, namespace=namespace, labels=labels,
                                                 resource_version=version, server_timeout=120):
                version = dep.metadata.resourceVersion
                await watched.record(dep)
        except asyncio.CancelledError:
            raise
        except Exception:  # the API server closed the watch: start again
            await asyncio.sleep(0.1)


def summary(values: Sequence[float]) -> dict[str, Any]:
    v = sorted(values)
    if not v:
        return {"n": 0}
    p99 = v[min(len(v) - 1, max(0, round(0.99 * len(v) + 0.5) - 1))]  # nearest rank
    return {"n": len(v), "min": v[0], "median": statistics.median(v), "mean": statistics.fmean(v),
            "p90": v[min(len(v) - 1, max(0, round(0.90 * len(v) + 0.5) - 1))], "p99": p99,
            "max": v[-1]}


# ---- cluster helpers ------------------------------------------------------------------------


class Cluster:
    def __init__(self, sandbox: Any) -> None:
        self.sb = sandbox
        self.kubeconfig = Path(sandbox.kubeconfig)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        p = self.sb.kubectl(*args, input=input, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p.stdout

    def apply_resources(self, namespace: str, names: Sequence[str], spec: dict[str, Any]) -> None:
        docs = [{"apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
                 "metadata": {"name": n, "namespace": namespace}, "spec": spec} for n in names]
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def wait_ready(self, namespace: str, names: Sequence[str], timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            items = json.loads(self.kubectl("get", "mtpi", "-n", namespace, "-o", "json"))["items"]
            ready = {i["metadata"]["name"]: i for i in items
                     if (i.get("status") or {}).get("phase") == "Ready"
                     and i["status"].get("observedGeneration") == i["metadata"]["generation"]}
            if set(names) <= set(ready):
                return ready
            if time.monotonic() > deadline:
                phases = {i["metadata"]["name"]: (i.get("status") or {}).get("phase")
                          for i in items}
                pods = json.loads(self.kubectl("get", "pods", "-n", namespace, "-o", "json"))
                pending = sorted({c.get("message", "") for p in pods["items"]
                                  for c in (p.get("status") or {}).get("conditions") or []
                                  if c["type"] == "PodScheduled" and c["status"] == "False"})
                raise TimeoutError(
                    f"resources not Ready in {timeout}s: {phases}; unschedulable pods: "
                    f"{pending or 'none'} (other namespaces may hold the simulated GPUs: "
                    "try fewer --resources or --products)")
            time.sleep(0.5)

    def delete_namespace(self, namespace: str) -> None:
        self.sb.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        self.sb.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0",
                        "--force", "--wait=false", check=False)
