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
bench/results/reaction.md (a table). `main(argv)` is the entry point (bench/scale/run.py may
call it).

    python bench/reaction/reaction.py                       # both phases, defaults
    python bench/reaction/reaction.py --alerts 100 --skip-evaluator
    MTP_SANDBOX_DIR=/tmp/sbx python bench/reaction/reaction.py --out /tmp/results

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
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from lightkube import AsyncClient, KubeConfig
from machine_info import machine  # bench/common/
from profiling import PhaseProfile

from support.operator_proc import OperatorProcess, free_port
from support.pool_fakes import PoolFakes
from support.scripts import load

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"

# this folder's modules by their paths: bench/scale/scale_bench.py loads this file by its path
load("bench/reaction/reaction_common.py")
load("bench/reaction/reaction_results.py")
from reaction_common import (  # noqa: E402
    BROKEN,
    HEALTHY,
    PRODUCTS,
    SANDBOX_NODES,
    TOKEN,
    Cluster,
    Watched,
    summary,
    watch_pools,
)
from reaction_results import markdown  # noqa: E402

# ---- webhook phase --------------------------------------------------------------------------


def alert_payload(namespace: str, resource: str, product: str, i: int) -> bytes:
    return webhook_body([alert_doc(namespace, resource, product, i)], i)


def webhook_body(alerts: list[dict[str, Any]], i: int) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "receiver": "mtp-operator",
                       "groupKey": f"bench-{i}", "groupLabels": {}, "commonLabels": {},
                       "commonAnnotations": {}, "externalURL": "http://bench",
                       "truncatedAlerts": 0, "alerts": alerts}).encode()


def alert_doc(namespace: str, resource: str, product: str, i: int) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return {
        "status": "firing",
        "labels": {"alertname": "MTPHitRateLow", "namespace": namespace,
                   "mtpinference": resource, "gpu_product": product, "severity": "warning"},
        "annotations": {"value": "0.61", "threshold": "0.88", "summary": "bench"},
        "startsAt": now, "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": f"bench-{uuid.uuid4().hex[:12]}-{i}",
    }


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


async def _big_body(session: aiohttp.ClientSession, url: str, watched: Watched, ns: str,
                    pools: list[tuple[str, str]], side: list[tuple[str, str]], n: int,
                    log) -> dict[str, Any]:
    """`n` alerts in one body, spread over `pools`; while it is in flight, one single alert
    at a time for each of `side` (pools the body does not name), each timed to its patch."""
    alerts = [alert_doc(ns, *pools[i % len(pools)], 20_000 + i) for i in range(n)]
    body = webhook_body(alerts, 20_000)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    log(f"webhook: one body of {n} alerts ({len(body) / 1e6:.2f} MB) for {len(pools)} pools; "
        f"{len(side)} single alerts for other pools while it is handled")
    t0 = time.monotonic()

    async def big() -> tuple[float, dict[str, Any]]:
        async with session.post(url, data=body, headers=headers) as resp:
            doc = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"big body: HTTP {resp.status} {doc}")
            return time.monotonic() - t0, doc

    task = asyncio.create_task(big())
    singles = []
    for i, pool in enumerate(side):
        await asyncio.sleep(0.02)
        in_flight = not task.done()  # the big body not yet answered when this one is sent
        singles.append(await _one_alert(session, url, watched, ns, pool, 30_000 + i)
                       | {"big_body_in_flight": in_flight})
    answer_s, doc = await task
    return {"alerts": n, "bytes": len(body), "answer_s": answer_s,
            "answer": {k: doc.get(k) for k in ("received", "signals", "changed", "unchanged")},
            "singles_during": sum(1 for s in singles if s["big_body_in_flight"]),
            "summary": {"patch_s": summary([s["patch_s"] for s in singles
                                            if s["big_body_in_flight"]])},
            "samples": singles}


async def webhook_phase(cluster: Cluster, args: argparse.Namespace, log) -> dict[str, Any]:
    ns = f"bench-reaction-wh-{uuid.uuid4().hex[:5]}"
    names = [f"r{i:02d}" for i in range(args.resources)]
    side_names = [f"s{i:02d}" for i in range(args.side_resources if args.big_body else 0)]
    cluster.kubectl("create", "namespace", ns)
    # the webhook acts only in namespaces that opted in (alerts.requireNamespaceOptIn)
    cluster.kubectl("label", "namespace", ns, "mtp-operator.io/alert-rollback=enabled")
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
        # every pool at the same fixed K, so each can take the burst's alert and its share of
        # the sequential ones before it reaches K=0 (the profile table's L40S K=2 could not)
        cluster.apply_resources(ns, names + side_names, {
            "model": "deepseek-ai/DeepSeek-V3", "gpuProducts": list(args.products),
            "tensorParallelSize": 1,
            "speculative": {"mtpLayers": 1, "numSpeculativeTokens": args.k},
            "rollback": {"cooldownSeconds": 0}})
        cluster.wait_ready(ns, names + side_names)
        watcher = asyncio.create_task(watch_pools(client, ns, watched))
        pools = [(n, p) for n in names for p in args.products]
        side = [(n, p) for n in side_names for p in args.products]
        async with watched.cond:
            await asyncio.wait_for(watched.cond.wait_for(
                lambda: all(p in watched.k for p in pools + side)), 30)
        per_pool = 1 + -(-args.alerts // len(pools))
        if per_pool > args.k:
            raise SystemExit(f"--alerts {args.alerts} over {len(pools)} pools needs K >= "
                             f"{per_pool} (burst + sequential); --k is {args.k}")
        url = f"http://127.0.0.1:{port}/alerts"
        sequential, burst = [], []
        big: dict[str, Any] | None = None
        profiles: dict[str, Any] = {}

        def profiled(phase: str) -> PhaseProfile:
            raw = args.profile / f"reaction-{phase}.collapsed" if args.profile else None
            return PhaseProfile(op.proc.pid, raw)

        async with aiohttp.ClientSession() as session:
            log(f"webhook: {len(pools)} pools Ready in {ns}; a burst of {len(pools)} alerts, "
                "one per pool, all at once")
            with profiled("burst") as prof:
                burst = list(await asyncio.gather(*(
                    _one_alert(session, url, watched, ns, pool, 10_000 + i)
                    for i, pool in enumerate(pools))))
            profiles["burst"] = prof.result
            await asyncio.sleep(1)
            log(f"webhook: {args.alerts} sequential alerts")
            order = [p for _ in range(args.alerts) for p in pools][: args.alerts]
            for i, pool in enumerate(order):
                sequential.append(await _one_alert(session, url, watched, ns, pool, i))
                await asyncio.sleep(args.spacing)
            if args.big_body:
                await asyncio.sleep(1)
                with profiled("big-body") as prof:
                    big = await _big_body(session, url, watched, ns, pools, side,
                                          args.big_body, log)
                profiles["big_body"] = prof.result
        return {
            "namespace": ns, "resources": len(names), "pools": len(pools), "k": args.k,
            "big_body": big, "profiles": profiles,
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
    names = [f"e{i:02d}" for i in range(args.evaluator_resources)]
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--resources", type=int, default=8, help="MTPInference resources per phase")
    p.add_argument("--products", nargs="+", default=list(PRODUCTS),
                   help="GPU products (pools) per resource")
    p.add_argument("--alerts", type=int, default=60, help="sequential webhook alerts (>= 50)")
    p.add_argument("--k", type=int, default=6,
                   help="numSpeculativeTokens of every webhook pool (alerts step it down)")
    p.add_argument("--big-body", type=int, default=5000,
                   help="alerts in one webhook body after the sequential ones (0: none)")
    p.add_argument("--side-resources", type=int, default=8,
                   help="resources the big body does not name: single alerts for their "
                   "pools are timed while it is handled")
    p.add_argument("--spacing", type=float, default=0.1,
                   help="seconds between sequential alerts")
    p.add_argument("--evaluator-samples", type=int, default=16)
    p.add_argument("--evaluator-resources", type=int, default=8,
                   help="resources of the evaluator phase (its fakes count drafts on the same "
                   "CPUs: at 25 x 4 pools on 2 cores a healthy pool's windowed hit rate "
                   "dipped below 0.88 and rolled back before the bench degraded it)")
    p.add_argument("--evaluator-interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes-per-product", type=int, default=None,
                   help="start a sandbox of its own with this many 8-GPU kwok nodes per GPU "
                   "product (the default sandbox has 2: 16 one-GPU pools per product)")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR",
                   help="profile the operator (py-spy) during the burst and the big body; "
                   "raw stacks go to DIR, the summary to reaction.json/.md")
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

    if args.nodes_per_product:  # a sandbox of its own, with enough simulated GPUs
        load("bench/scale/scale_common.py")  # scale_cluster imports it by name
        nodes_file = load("bench/scale/scale_cluster.py").nodes_file

        state = Path(tempfile.gettempdir()) / "mtp-reaction-sandbox"
        state.mkdir(exist_ok=True)
        # outside the state dir: bringing down a stale sandbox there empties it
        nodes = nodes_file(state.parent / "mtp-reaction-nodes.yaml", args.nodes_per_product)
        sb = Sandbox(state, nodes_file=nodes)
    else:
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
                                      sb, loadavg_start=os.getloadavg()[0],
                                      nodes=f"kwok: {args.nodes_per_product} x 4 GPU products "
                                      "(8 GPUs each)" if args.nodes_per_product
                                      else SANDBOX_NODES)}
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
        if args.nodes_per_product:
            sb.down()


if __name__ == "__main__":
    raise SystemExit(main())
