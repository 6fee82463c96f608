"""One measured process of the evaluator benchmark (bench/scale/scale_evaluator.py runs it).

floor      A bare client: every `interval` seconds it fetches every pod's metrics URL (the
           evaluator's own URL and headers, the same concurrency and time-out, started over
           the same part of the interval) and reads each body; it parses nothing. It fetches
           through the evaluator's own HTTP client (adapters/keepalive_http.py), so what the
           evaluator spends beyond it is parsing and deciding.
floor-aiohttp  The same fetches through aiohttp's client (the evaluator's transport
           before keepalive_http.py), for comparison.
evaluator  The operator's built-in evaluator (control/evaluator.py: run_evaluator, Evaluator,
           the real Reconciler and RollbackActions; control/heap.py's freezing beside it)
           over an in-memory cluster view
           (tests/support/fake_cluster.py, checked against the real watches by
           tests/unit/control/test_ports.py) holding --resources MTPInferences x 4 GPU products with
           one Ready pod per pool, whose IP is a loopback metric source.

Each round's start and end (and this process's CPU seconds at its end) are recorded; the
evaluator also records when each pod's scrape ended and when each signal was handed to the
rollback actions (the decision). Results: JSON to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import time
from pathlib import Path
from typing import Any

import aiohttp

from mtp_operator.adapters import scrape
from mtp_operator.adapters.keepalive_http import HTTPError
from mtp_operator.control import evaluator as evaluator_module
from mtp_operator.control.evaluator import Evaluator, run_evaluator
from mtp_operator.control.heap import keep_heap_frozen
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

NAMESPACE = "bench"


class GcPauses:
    """The cyclic garbage collector's passes while installed: count, seconds, longest pause,
    per generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.passes: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._t0 = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.passes[info["generation"]].append(time.perf_counter() - self._t0)

    def summary(self) -> dict[str, Any]:
        gc.callbacks.remove(self._note)
        return {str(g): {"passes": len(p), "seconds": round(sum(p), 3),
                         "longest_seconds": round(max(p, default=0.0), 4)}
                for g, p in self.passes.items()}  # fmt: skip


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Rounds:
    """Round records: loop-time start/end, wall-clock start, CPU seconds at the end."""

    def __init__(self) -> None:
        self.items: list[dict[str, float]] = []
        self.offset = time.time() - asyncio.get_running_loop().time()

    def add(self, started: float, finished: float, signals: int = 0) -> None:
        self.items.append({"start": started + self.offset, "end": finished + self.offset,
                           "cpu": time.process_time(), "signals": signals})  # fmt: skip


async def floor(cfg: dict[str, Any], use_aiohttp: bool = False) -> dict[str, Any]:
    ips = [p["ip"] for p in cfg["pods"]]
    rounds = Rounds()
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(scrape.MAX_PARALLEL_SCRAPES)
    ok = []
    idle = 2 * cfg["interval"] + 5  # as run_evaluator keeps them
    spread = cfg["interval"] * evaluator_module.SPREAD_FRACTION  # as the evaluator's rounds
    step = spread / len(ips)
    client = scrape.scrape_client(idle_seconds=idle)
    session = None
    if use_aiohttp:
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=scrape.SCRAPE_TIMEOUT_SECONDS,
                                          sock_connect=scrape.CONNECT_TIMEOUT_SECONDS),
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=idle))  # fmt: skip

    async def fetch(i: int, ip: str, t0: float) -> int:
        await asyncio.sleep(max(0.0, t0 + i * step - loop.time()))
        async with sem:
            try:
                if session is None:
                    status, body = await client.get(ip, cfg["port"], scrape.METRICS_PATH)
                    return len(body) if status == 200 else 0
                url = scrape.metrics_url(ip, cfg["port"])
                async with session.get(url, headers=scrape.SCRAPE_HEADERS) as resp:
                    return len(await resp.read()) if resp.status == 200 else 0
            except (aiohttp.ClientError, HTTPError, TimeoutError):
                return 0

    try:
        due = loop.time()
        for _ in range(cfg["rounds"]):
            started = loop.time()
            sizes = await asyncio.gather(*(fetch(i, ip, started) for i, ip in enumerate(ips)))
            rounds.add(started, loop.time())
            ok.append(sum(1 for s in sizes if s))
            due = max(due + cfg["interval"], loop.time())
            await asyncio.sleep(due - loop.time())
    finally:
        await client.close()
        if session is not None:
            await session.close()
    return {"rounds": rounds.items, "ok_per_round": ok, "bytes_last_round": sum(sizes),
            "peak_rss_mib": round(peak_rss_mib(), 1)}  # fmt: skip


async def build_cluster(cfg: dict[str, Any]) -> tuple[RollbackActions, dict[tuple, str]]:
    """The resources, reconciled into pools (Deployments delivered Ready), and each pool's
    pod IP; returns the rollback actions and {(resource, product): ip}."""
    products = cfg["products"]
    per_product = -(-cfg["resources"] // 8)  # 8 GPUs a node, 1 GPU a pool
    kube = FakeKube()
    view = FakeView(nodes=[node(f"n-{i}-{j}", p) for i, p in enumerate(products)
                           for j in range(per_product)])  # fmt: skip
    spec = {"model": "org/model", "rollback": cfg["rollback"]}
    names = [f"r-{i:04d}" for i in range(cfg["resources"])]
    for name in names:
        view.add(mtpinference(name, spec, namespace=NAMESPACE))
    reconciler = Reconciler(kube, view, OperatorSettings())
    for _ in range(2):
        await reconciler.reconcile_all()
        view.deliver(kube, ready=True)
    ips = {}
    for pod in cfg["pods"]:
        key, product = (NAMESPACE, names[pod["resource"]]), products[pod["product"]]
        view.pods[(key, product)] = {f"{key[1]}-{pod['product']}-0": pod["ip"]}
        ips[(key[1], product)] = pod["ip"]
    pools = sum(len(reconciler.current_status(k, view.resource(k)).pools)
                for k in view.resource_keys())  # fmt: skip
    if pools != len(cfg["pods"]):
        raise SystemExit(f"{pools} pools in status, {len(cfg['pods'])} pods configured")
    return RollbackActions(kube, view, reconciler), ips


async def evaluate(cfg: dict[str, Any]) -> dict[str, Any]:
    actions, ips = await build_cluster(cfg)
    loop = asyncio.get_running_loop()
    rounds = Rounds()
    scrapes: list[tuple[str, float, bool]] = []  # (ip, wall-clock end, ok), this round
    per_round_scrapes: list[list[tuple[str, float, bool]]] = []
    decisions: dict[str, dict[str, Any]] = {}  # ip → first firing signal
    real_scrape = scrape.scrape_pod_timed

    async def recorded_scrape(session, ip, sem, port):  # the real scrape, its end noted
        snap, seconds = await real_scrape(session, ip, sem, port)
        scrapes.append((ip, time.time(), snap is not None))
        return snap, seconds

    evaluator_module.scrape_pod_timed = recorded_scrape  # type: ignore[assignment]
    real_apply = actions.apply_signals

    async def recorded_apply(signals):
        t = time.time()
        for s in signals:
            ip = ips[(s.target.mtpinference, s.target.gpu_product)]
            if s.status == "firing" and ip not in decisions:
                decisions[ip] = {"time": t, "alert": s.alert, "value": s.value}
        return await real_apply(signals)

    actions.apply_signals = recorded_apply  # type: ignore[method-assign]

    def on_round(started: float, finished: float, signals: int) -> None:
        rounds.add(started, finished, signals)
        per_round_scrapes.append(list(scrapes))
        scrapes.clear()

    wanted = {p["ip"] for p in cfg["pods"] if p.get("degrade") is not None}
    pauses = GcPauses()
    # beside the evaluator, as the operator's main runs it; the cluster view is whole now
    # and, as in the operator, frozen SETTLE_SECONDS later (within the measured rounds)
    heap = asyncio.create_task(keep_heap_frozen(lambda: True))
    task = asyncio.create_task(run_evaluator(actions, cfg["interval"], evaluator=Evaluator(
        actions, port=cfg["port"]), on_round=on_round))  # fmt: skip
    deadline = loop.time() + cfg["max_seconds"]
    while loop.time() < deadline:
        await asyncio.sleep(0.2)
        if len(rounds.items) >= cfg["rounds"] and wanted <= decisions.keys():
            break
    task.cancel()
    heap.cancel()
    kinds = {p["ip"]: p.get("kind", "ok") for p in cfg["pods"]}
    summary = []
    for r, done in zip(rounds.items, per_round_scrapes, strict=True):
        ok_ends = [t for ip, t, _ in done if kinds[ip] == "ok"]
        summary.append({**r, "scrapes": len(done), "ok": sum(1 for *_, ok in done if ok),
                        "healthy_done": max(ok_ends) if ok_ends else None})  # fmt: skip
    return {"rounds": summary, "decisions": decisions, "gc": pauses.summary(),
            "peak_rss_mib": round(peak_rss_mib(), 1)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("floor", "floor-aiohttp", "evaluator"))
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    cfg = json.loads(args.config.read_text())
    runs = {"floor": floor, "floor-aiohttp": lambda c: floor(c, use_aiohttp=True),
            "evaluator": evaluate}  # fmt: skip
    result = asyncio.run(runs[args.mode](cfg))
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
