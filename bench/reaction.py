#!/usr/bin/env python3
"""Reaction time of the operator's automatic rollback, measured on the local sandbox.

Two ways in, each with its own namespace and operator process (`mtp-operator run`):

webhook    Several MTPInference resources (default 8 x 4 GPU pools, cooldownSeconds 0 so
           every alert acts). Single Alertmanager-style alerts (webhook v4, one per request,
           bearer token) are posted to the operator's POST /alerts, spread round-robin over all
           resources and pools; each is timed from just before the POST to the moment a
           Deployment watch (lightkube AsyncClient) delivers that pool's Deployment with the
           next lower K. `sequential`: one alert at a time; `burst`: one alert for every pool
           at once (decisions are serialised per MTPInference, so this shows queueing).
evaluator  The built-in evaluator (`--evaluator --evaluator-interval 1`), no Prometheus. Every
           pool pod gets a FakeVLLM on its IP:8000 (vLLM 0.33.0 metrics, 100 drafts/s, p=0.95).
           One pool at a time, its acceptance drops to 0; timed from that moment (and from the
           moment the windowed hit rate in the fake's own counters crosses minHitRate) to the
           patched Deployment. Resource rollback settings: windowSeconds 5, forSeconds 0,
           minDrafts 20.

Results: bench/results/reaction.json (every sample, summaries, settings, machine) and
bench/results/reaction.md (a table). `main(argv)` is the entry point (bench/run.py may call it).

    python bench/reaction.py                       # both phases, defaults
    python bench/reaction.py --alerts 100 --skip-evaluator
    MTP_SANDBOX_DIR=/tmp/sbx python bench/reaction.py --out /tmp/results

The sandbox is brought up if needed (`Sandbox().acquire`, state in .sandbox or
$MTP_SANDBOX_DIR) and left running; stop it with `make sandbox-down`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "sandbox")]

import aiohttp  # noqa: E402
import yaml  # noqa: E402
from lightkube import AsyncClient, KubeConfig  # noqa: E402
from lightkube.resources.apps_v1 import Deployment  # noqa: E402
from machine_info import machine  # noqa: E402  (bench/ is sys.path[0])

from support.operator_proc import OperatorProcess, free_port  # noqa: E402
from support.pool_fakes import LABEL_RESOURCE, PoolFakes, deployment_k  # noqa: E402

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


# ---- webhook phase --------------------------------------------------------------------------


def alert_payload(namespace: str, resource: str, product: str, i: int) -> bytes:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    alert = {
        "status": "firing",
        "labels": {"alertname": "MTPHitRateLow", "namespace": namespace,
                   "mtpinference": resource, "gpu_product": product, "severity": "warning"},
        "annotations": {"value": "0.61", "threshold": "0.88", "summary": "bench"},
        "startsAt": now, "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": f"bench-{uuid.uuid4().hex[:12]}-{i}",
    }
    return json.dumps({"version": "4", "status": "firing", "receiver": "mtp-operator",
                       "groupKey": f"bench-{i}", "groupLabels": {}, "commonLabels": {},
                       "commonAnnotations": {}, "externalURL": "http://bench",
                       "truncatedAlerts": 0, "alerts": [alert]}).encode()


async def _one_alert(session: aiohttp.ClientSession, url: str, watched: Watched,
                     namespace: str, pool: tuple[str, str], i: int) -> dict[str, Any]:
    k = watched.k[pool]
    body = alert_payload(namespace, *pool, i)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    t0 = time.monotonic()
    async with session.post(url, data=body, headers=headers) as resp:
        doc = await resp.json()
        t_answer = time.monotonic()
        if resp.status != 200 or doc.get("changed") != 1:
            raise RuntimeError(f"alert {i} for {pool}: HTTP {resp.status} {doc}")
    async with asyncio.timeout(30):
        t_patch = await watched.wait_k(pool, k - 1)
    return {"resource": pool[0], "gpu_product": pool[1], "from_k": k, "to_k": k - 1,
            "http_s": t_answer - t0, "patch_s": t_patch - t0}


async def webhook_phase(cluster: Cluster, args: argparse.Namespace, log) -> dict[str, Any]:
    ns = f"bench-reaction-wh-{uuid.uuid4().hex[:5]}"
    names = [f"r{i:02d}" for i in range(args.resources)]
    cluster.kubectl("create", "namespace", ns)
    tmp = Path(tempfile.mkdtemp(prefix="mtp-reaction-"))
    (tmp / "token").write_text(TOKEN + "\n")
    port = free_port()
    op = OperatorProcess(cluster.kubeconfig, tmp, ["--namespace", ns, "--no-evaluator",
                         "--alerts-address", f"127.0.0.1:{port}",
                         "--alerts-token-file", str(tmp / "token")]).start()
    client = AsyncClient(KubeConfig.from_file(str(cluster.kubeconfig)))
    watched = Watched()
    watcher = None
    try:
        cluster.apply_resources(ns, names, {
            "model": "deepseek-ai/DeepSeek-V3", "gpuProducts": list(args.products),
            "speculative": {"mtpLayers": 1}, "rollback": {"cooldownSeconds": 0}})
        cluster.wait_ready(ns, names)
        watcher = asyncio.create_task(watch_pools(client, ns, watched))
        pools = [(n, p) for n in names for p in args.products]
        async with watched.cond:
            await asyncio.wait_for(watched.cond.wait_for(
                lambda: all(p in watched.k for p in pools)), 30)
        log(f"webhook: {len(pools)} pools Ready in {ns}; {args.alerts} sequential alerts")
        url = f"http://127.0.0.1:{port}/alerts"
        sequential, burst = [], []
        async with aiohttp.ClientSession() as session:
            order = [p for _ in range(args.alerts) for p in pools][: args.alerts]
            for i, pool in enumerate(order):
                sequential.append(await _one_alert(session, url, watched, ns, pool, i))
                await asyncio.sleep(args.spacing)
            log(f"webhook: burst of {len(pools)} alerts, one per pool, all at once")
            await asyncio.sleep(1)
            burst = list(await asyncio.gather(*(
                _one_alert(session, url, watched, ns, pool, 10_000 + i)
                for i, pool in enumerate(p for p in pools if watched.k[p] > 0))))
        return {
            "namespace": ns, "resources": len(names), "pools": len(pools),
            "sequential": {"summary": {
                "patch_s": summary([s["patch_s"] for s in sequential]),
                "http_s": summary([s["http_s"] for s in sequential])},
                "samples": sequential},
            "burst": {"summary": {
                "patch_s": summary([s["patch_s"] for s in burst]),
                "http_s": summary([s["http_s"] for s in burst])},
                "samples": burst},
            "operator_receive_to_patch_s": {
                "count": op.metric("mtp_operator_rollback_seconds_count"),
                "sum": op.metric("mtp_operator_rollback_seconds_sum")},
        }
    finally:
        if watcher:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        await client.close()
        op.stop()
        cluster.delete_namespace(ns)


# ---- evaluator phase ------------------------------------------------------------------------


def _pool_counters(fakes: PoolFakes, pool: tuple[str, str]) -> tuple[float, float]:
    """(drafts, accepted at position 0) summed over the pool's serving fakes."""
    d = c0 = 0.0
    for s in fakes.serving(pool[0]).get(pool[1], []):
        d += s.fake.drafts
        c0 += s.fake.per_position[0] if s.fake.per_position else 0.0
    return d, c0


async def sample_counters(fakes: PoolFakes, history: dict[tuple[str, str], list[Any]],
                          keep: float) -> None:
    """Every 50 ms, each pool's (time, drafts, c0) from its fakes, `keep` seconds of it."""
    while True:
        now = time.monotonic()
        for pool, h in history.items():
            h.append((now, *_pool_counters(fakes, pool)))
            while h and h[0][0] < now - keep:
                h.pop(0)
        await asyncio.sleep(0.05)


def crossing_time(history: list[tuple[float, float, float]], window: float,
                  threshold: float, after: float) -> float | None:
    """First time >= `after` at which the hit rate over `window` seconds, from the fake's own
    counters (samples (t, drafts, c0)), is below `threshold`."""
    for t, d, c0 in history:
        if t < after:
            continue
        base = [h for h in history if h[0] <= t - window]
        if not base:
            continue
        _, d0, c00 = base[-1]
        if d - d0 > 0 and (c0 - c00) / (d - d0) < threshold:
            return t
    return None


async def evaluator_phase(cluster: Cluster, args: argparse.Namespace, log) -> dict[str, Any]:
    ns = f"bench-reaction-ev-{uuid.uuid4().hex[:5]}"
    names = [f"e{i:02d}" for i in range(args.resources)]
    rollback = {"windowSeconds": 5, "forSeconds": 0, "minDrafts": 20, "cooldownSeconds": 60}
    cluster.kubectl("create", "namespace", ns)
    tmp = Path(tempfile.mkdtemp(prefix="mtp-reaction-"))
    op = OperatorProcess(cluster.kubeconfig, tmp, [
        "--namespace", ns, "--evaluator", "--evaluator-interval", str(args.evaluator_interval),
    ]).start()
    client = AsyncClient(KubeConfig.from_file(str(cluster.kubeconfig)))
    watched = Watched()
    watcher = None
    fakes = PoolFakes(cluster.kubeconfig, ns, default_acceptance=HEALTHY)
    try:
        cluster.apply_resources(ns, names, {
            "model": "deepseek-ai/DeepSeek-V3", "gpuProducts": list(args.products),
            "speculative": {"mtpLayers": 1}, "rollback": rollback})
        ready = cluster.wait_ready(ns, names)
        watcher = asyncio.create_task(watch_pools(client, ns, watched))
        fakes.start()
        pools = [(n, p) for n in names for p in args.products]
        for n in names:
            ks = {p["gpuProduct"]: p["numSpeculativeTokens"] for p in ready[n]["status"]["pools"]}
            await asyncio.to_thread(fakes.wait_serving, ks, n, 60)
        samples_wanted = min(args.evaluator_samples, len(pools))
        log(f"evaluator: {len(pools)} pools with fakes in {ns}; warming the "
            f"{rollback['windowSeconds']} s windows, then {samples_wanted} pools one by one")
        history: dict[tuple[str, str], list[tuple[float, float, float]]] = {p: [] for p in pools}
        sampler = asyncio.create_task(
            sample_counters(fakes, history, 2 * rollback["windowSeconds"]))
        await asyncio.sleep(rollback["windowSeconds"] + 2 * args.evaluator_interval)
        samples = []
        rng = random.Random(args.seed)
        for i in range(samples_wanted):
            pool = pools[(i * 7) % len(pools)]  # spread over resources and products
            k = watched.k[pool]
            t0 = time.monotonic()
            fakes.set_acceptance(pool, BROKEN)
            async with asyncio.timeout(30):
                t_patch = await watched.wait_k(pool, k - 1)
            fakes.set_acceptance(pool, HEALTHY)  # the new pods at K-1 serve well
            t_cross = crossing_time([h for h in history[pool] if h[0] <= t_patch],
                                    rollback["windowSeconds"], 0.88, t0)
            samples.append({"resource": pool[0], "gpu_product": pool[1], "from_k": k,
                            "to_k": k - 1, "degrade_to_patch_s": t_patch - t0,
                            "crossing_to_patch_s": (t_patch - t_cross) if t_cross else None,
                            "degrade_to_crossing_s": (t_cross - t0) if t_cross else None})
            # a random gap, so the drops fall at every phase of the evaluator's interval
            await asyncio.sleep(0.3 + rng.uniform(0, args.evaluator_interval))
        sampler.cancel()
        return {
            "namespace": ns, "resources": len(names), "pools": len(pools),
            "interval_s": args.evaluator_interval, "rollback": rollback,
            "acceptance": {"healthy": HEALTHY, "degraded": BROKEN},
            "drafts_per_second": fakes.default_rate,
            "summary": {
                "degrade_to_patch_s": summary([s["degrade_to_patch_s"] for s in samples]),
                "crossing_to_patch_s": summary([s["crossing_to_patch_s"] for s in samples
                                                if s["crossing_to_patch_s"] is not None]),
            },
            "samples": samples,
        }
    finally:
        fakes.stop()
        if watcher:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        await client.close()
        op.stop()
        cluster.delete_namespace(ns)


# ---- output ---------------------------------------------------------------------------------


def _row(name: str, s: dict[str, Any], what: str) -> str:
    if not s.get("n"):
        return f"| {name} | {what} | 0 | - | - | - | - |"
    ms = lambda x: f"{x * 1000:.0f} ms"  # noqa: E731
    return (f"| {name} | {what} | {s['n']} | {ms(s['min'])} | {ms(s['median'])} | "
            f"{ms(s['p99'])} | {ms(s['max'])} |")


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Rollback reaction time (sandbox)",
        "",
        f"Measured {result['finished']} by `bench/reaction.py` on {m['nproc']} CPUs "
        f"({m['cpu'] or 'unknown CPU'}), {m['memory_gib']} GiB, Python {m['python']}, "
        f"kube-apiserver {m['kube_apiserver']} (local sandbox; {m['nodes']}); 1-minute load "
        f"average {m['loadavg_start']:.1f} at the start, {m['loadavg_end']:.1f} at the end "
        "(the sandbox, the operator, the fakes and this script share these CPUs).",
        "",
        "| path | measured | n | min | median | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    wh = result.get("webhook")
    if wh:
        lines.append(_row("webhook, one alert at a time", wh["sequential"]["summary"]["patch_s"],
                          "POST sent → Deployment patched (watch)"))
        lines.append(_row("webhook, one alert at a time", wh["sequential"]["summary"]["http_s"],
                          "POST sent → 200 answered"))
        burst = wh["burst"]["summary"]["patch_s"]
        lines.append(_row(f"webhook, {burst['n']} alerts at once (one per pool)", burst,
                          "POST sent → Deployment patched (watch)"))
    ev = result.get("evaluator")
    if ev:
        lines.append(_row("built-in evaluator", ev["summary"]["degrade_to_patch_s"],
                          f"acceptance {HEALTHY}→{BROKEN} → Deployment patched"))
        lines.append(_row("built-in evaluator", ev["summary"]["crossing_to_patch_s"],
                          "windowed hit rate < 0.88 in the fake's counters → patched"))
    lines.append("")
    if wh:
        lines.append(
            f"Webhook: {wh['resources']} resources x {wh['pools'] // wh['resources']} pools, "
            "cooldownSeconds 0 (each alert acts), single MTPHitRateLow alerts (webhook v4, "
            "bearer token) spread round-robin over the pools; the Deployment watch is a "
            "lightkube AsyncClient in the bench process. The receiver answers 200 after the "
            "status write and the patch, so the answer comes after the patch is visible. The "
            "burst sends one alert to every pool still speculating (K > 0) at the same time "
            "(one request each); the receiver handles requests concurrently but decides and "
            "patches one pool at a time per MTPInference, and the operator, the API server "
            "and this script share the CPUs, so later ones wait.")
    if ev:
        r = ev["rollback"]
        lines.append(
            f"Evaluator: `--evaluator-interval {ev['interval_s']:g}`, windowSeconds "
            f"{r['windowSeconds']}, forSeconds {r['forSeconds']}, minDrafts {r['minDrafts']}; "
            f"FakeVLLM per pod at {ev['drafts_per_second']:g} drafts/s. The evaluator acts on "
            "the first scrape after the crossing, so its reaction is bounded by the interval "
            "plus a scrape and a reconcile.")
    lines.append("")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--resources", type=int, default=8, help="MTPInference resources per phase")
    p.add_argument("--products", nargs="+", default=list(PRODUCTS),
                   help="GPU products (pools) per resource")
    p.add_argument("--alerts", type=int, default=60, help="sequential webhook alerts (>= 50)")
    p.add_argument("--spacing", type=float, default=0.1,
                   help="seconds between sequential alerts")
    p.add_argument("--evaluator-samples", type=int, default=16)
    p.add_argument("--evaluator-interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-webhook", action="store_true")
    p.add_argument("--skip-evaluator", action="store_true")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    log = (lambda *_: None) if args.quiet else (lambda msg: print(f"[reaction] {msg}",
                                                                  flush=True))
    from sandbox import Sandbox

    sb = Sandbox()
    sb.acquire(started_by="bench")
    try:
        cluster = Cluster(sb)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                        str(REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"))
        cluster.kubectl("wait", "--for=condition=Established",
                        "crd/mtpinferences.mtp-operator.io", "--timeout=60s")
        result: dict[str, Any] = {"started": datetime.now(UTC).isoformat(timespec="seconds"),
                                  "machine": machine(
                                      sb, loadavg_start=os.getloadavg()[0], nodes=SANDBOX_NODES)}
        if not args.skip_webhook:
            result["webhook"] = asyncio.run(webhook_phase(cluster, args, log))
            s = result["webhook"]["sequential"]["summary"]["patch_s"]
            log(f"webhook: alert -> patch median {s['median'] * 1000:.0f} ms, "
                f"p99 {s['p99'] * 1000:.0f} ms, max {s['max'] * 1000:.0f} ms (n={s['n']})")
        if not args.skip_evaluator:
            result["evaluator"] = asyncio.run(evaluator_phase(cluster, args, log))
            s = result["evaluator"]["summary"]["degrade_to_patch_s"]
            log(f"evaluator: degradation -> patch median {s['median']:.2f} s, "
                f"max {s['max']:.2f} s (n={s['n']})")
        result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        result["machine"]["loadavg_end"] = os.getloadavg()[0]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "reaction.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "reaction.md").write_text(markdown(result))
        log(f"wrote {args.out / 'reaction.json'} and {args.out / 'reaction.md'}")
        if not args.quiet:
            print(markdown(result))
        return 0
    finally:
        sb.release(keep=True)


if __name__ == "__main__":
    raise SystemExit(main())
