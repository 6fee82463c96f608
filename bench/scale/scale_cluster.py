"""Scale benchmark: the cluster side (nodes, resources, floor objects, readiness, applying)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import ApiError, AsyncClient, codecs
from scale_common import FIELD_MANAGER, FLOOR_NS, OP_NS, log

from mtp_operator.render import render_resource


def sandbox_products() -> list[str]:
    """The GPU products of the sandbox's nodes (tests/sandbox/nodes.yaml), sorted."""
    from sandbox import NODES_YAML

    spec = yaml.safe_load(NODES_YAML.read_text())
    return sorted({p["product"] for p in spec["pools"] if p.get("product")})


def nodes_file(path: Path, per_product: int) -> Path:
    from sandbox import NODES_YAML

    spec = yaml.safe_load(NODES_YAML.read_text())
    spec["pools"] = [p for p in spec["pools"] if p.get("product")]  # GPU nodes only
    for pool in spec["pools"]:
        pool["count"] = per_product
        pool["gpus"] = 8
    path.write_text(yaml.safe_dump(spec))
    return path


def resource_doc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "mtp-operator.io/v1alpha1",
        "kind": "MTPInference",
        "metadata": {"name": name, "namespace": OP_NS},
        "spec": {"model": "deepseek-ai/DeepSeek-V3", "tensorParallelSize": 1, "replicas": 1},
    }


def floor_objects(names: Iterable[str]) -> list[dict[str, Any]]:
    """What the operator would create, pre-rendered; no owner (the GC would delete them)."""
    out = []
    for name in names:
        for obj in render_resource(resource_doc(name), sandbox_products()):
            obj = copy.deepcopy(obj)
            obj["metadata"]["namespace"] = FLOOR_NS
            obj["metadata"].pop("ownerReferences", None)
            out.append(obj)
    return out


def as_dict(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


def mtpi_ready(d: Mapping[str, Any]) -> bool:
    st = d.get("status") or {}
    return st.get("phase") == "Ready" and st.get("observedGeneration") == (
        d.get("metadata") or {}
    ).get("generation")


def deployment_ready(d: Mapping[str, Any]) -> bool:
    spec, st = d.get("spec") or {}, d.get("status") or {}
    want = spec.get("replicas", 1)
    return (
        st.get("observedGeneration", 0) >= (d.get("metadata") or {}).get("generation", 1)
        and st.get("readyReplicas", 0) >= want
        and st.get("updatedReplicas", 0) >= want
    )


class Tracker:
    """Readiness of every object of one kind in a namespace, kept by one watch."""

    def __init__(self, ready: Callable[[Mapping[str, Any]], bool]) -> None:
        self.is_ready = ready
        self.ready: dict[str, float] = {}  # name -> first time seen ready (monotonic)
        self.seen: set[str] = set()
        self.changed = asyncio.Event()

    async def run(self, client: AsyncClient, kind: Any, namespace: str) -> None:
        while True:
            try:
                async for typ, obj in client.watch(kind, namespace=namespace):
                    d = as_dict(obj)
                    name = d["metadata"]["name"]
                    if typ == "DELETED":
                        self.seen.discard(name)
                        self.ready.pop(name, None)
                    else:
                        self.seen.add(name)
                        if self.is_ready(d):
                            self.ready.setdefault(name, time.monotonic())
                    self.changed.set()
            except (ApiError, httpx.HTTPError) as err:
                log(f"watch {namespace}: {err}; again")
                await asyncio.sleep(1)

    async def wait(self, names: set[str], limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        last_report = time.monotonic()
        while not names <= set(self.ready):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{what}: {len(names & set(self.ready))}/{len(names)} ready after {limit}s"
                )
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 5))
            if time.monotonic() - last_report > 15:
                log(f"  {what}: {len(names & set(self.ready))}/{len(names)} ready")
                last_report = time.monotonic()


async def apply_all(client: AsyncClient, docs: Sequence[dict[str, Any]], concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(doc: dict[str, Any]) -> None:
        res = codecs.from_dict(doc)
        async with sem:
            for attempt in range(5):
                try:
                    await client.apply(res, field_manager=FIELD_MANAGER, force=True)
                    return
                except (ApiError, httpx.HTTPError) as err:
                    if attempt == 4:
                        raise
                    log(f"apply {doc['metadata']['name']}: {err}; retrying")
                    await asyncio.sleep(0.5 * (attempt + 1))

    await asyncio.gather(*(one(d) for d in docs))


def quantiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))], 2)

    return {"p50": q(0.5), "p90": q(0.9), "max": round(v[-1], 2)}
