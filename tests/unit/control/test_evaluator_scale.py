"""The built-in evaluator at scale: it asks /metrics for the spec-decode samples only
(prometheus_client's name[] filter; a server that ignores it, as vLLM does, costs only the
bytes: spec_snapshot skips the rest); pods whose last scrape failed or was slow get a lane of
their own; rounds keep a fixed cadence, the pools spread over part of it."""

from __future__ import annotations

import asyncio
import itertools
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from mtp_operator.adapters import scrape
from mtp_operator.control import evaluator as evaluator_module
from mtp_operator.control.evaluator import Evaluator, run_evaluator
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.settings import OperatorSettings
from mtp_runtime.spec_decode import SPEC_DECODE_COUNTERS
from support.fake_cluster import FakeKube, FakeView, mtpinference, node
from support.fake_vllm import FakeVLLM

pytestmark = pytest.mark.unit

H100 = "NVIDIA-H100-80GB-HBM3"
KEY = ("ml", "res")


@pytest.fixture
def vllm_like_server():
    """A prometheus_client HTTP server with vLLM's spec-decode counters (names, labels) and
    one of its histograms; yields (port, registry values)."""
    reg = CollectorRegistry()
    labels = {"engine": "0", "model_name": "m"}
    names = [n.removesuffix("_total") for n in SPEC_DECODE_COUNTERS]
    drafts, tokens, accepted = (Counter(n, "x", list(labels), registry=reg) for n in names[:3])
    per_pos = Counter(names[3], "x", [*labels, "position"], registry=reg)
    latency = Histogram("vllm:e2e_request_latency_seconds", "x", list(labels), registry=reg)
    drafts.labels(**labels).inc(10)
    tokens.labels(**labels).inc(40)
    accepted.labels(**labels).inc(25)
    for j, v in enumerate((9, 7, 5, 4)):
        per_pos.labels(**labels, position=str(j)).inc(v)
    latency.labels(**labels).observe(0.3)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        thread.join(5)


def test_prometheus_client_answers_only_the_spec_decode_samples(vllm_like_server) -> None:
    base = f"http://127.0.0.1:{vllm_like_server}"
    whole = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    asked = urllib.request.urlopen(base + scrape.METRICS_PATH, timeout=5).read().decode()
    assert "vllm:e2e_request_latency_seconds_bucket" in whole
    samples = [ln for ln in asked.splitlines() if not ln.startswith("#")]
    assert {ln.split("{")[0] for ln in samples} == set(SPEC_DECODE_COUNTERS)
    assert len(samples) == 3 + 4 and len(asked) < len(whole) / 2


async def test_scrape_pod_reads_the_counters_through_the_filter(vllm_like_server) -> None:
    async with scrape.scrape_client() as session:
        snap = await scrape.scrape_pod(
            session, "127.0.0.1", asyncio.Semaphore(1), port=vllm_like_server
        )
    (counters,) = snap.values()
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (10, 40, 25)
    assert counters.per_position == (9, 7, 5, 4)


@pytest.fixture
async def hanging_server():
    """Accepts connections and never answers."""
    waiting: list[asyncio.StreamWriter] = []

    async def handle(_reader, writer) -> None:
        waiting.append(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for w in waiting:
            w.close()


async def test_a_hanging_pod_gets_its_own_lane_after_its_first_failure(
    hanging_server, monkeypatch
) -> None:
    kube, view = FakeKube(), FakeView(nodes=[node("h1", H100)])
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8}))
    reconciler = Reconciler(kube, view, OperatorSettings())
    for _ in range(2):
        await reconciler.reconcile(KEY)
        view.deliver(kube, ready=True)
    # the hanging pod on 127.0.0.1, three healthy ones on addresses of their own; each pod
    # at its own port (the scrape below is given it)
    fakes = [FakeVLLM(k=6, host=f"127.0.0.{i + 2}", port=0, seed=i).start() for i in range(3)]
    ports = {"127.0.0.1": hanging_server} | {f.host: f.port for f in fakes}
    pods = {"hang": "127.0.0.1"} | {f"ok-{i}": f.host for i, f in enumerate(fakes)}
    view.pods[(KEY, H100)] = pods
    real = scrape.scrape_pod_timed
    ended: list[str] = []

    async def per_pod_port(session, ip, sem, port):
        out = await real(session, ip, sem, ports[ip])
        ended.append(ip)
        return out

    monkeypatch.setattr(evaluator_module, "scrape_pod_timed", per_pod_port)
    monkeypatch.setattr(evaluator_module, "MAX_PARALLEL_SCRAPES", 1)
    monkeypatch.setattr(evaluator_module, "SUSPECT_PARALLEL", 1)
    evaluator = Evaluator(RollbackActions(kube, view, reconciler))
    try:
        async with scrape.scrape_client(timeout=0.5) as session:
            await evaluator.tick(session, evaluator_module.datetime.now(evaluator_module.UTC))
            # one slot: the hanging pod (first) held it until its time-out
            assert ended[0] == "127.0.0.1" and evaluator.suspects == {"127.0.0.1"}
            ended.clear()
            await evaluator.tick(session, evaluator_module.datetime.now(evaluator_module.UTC))
            # now in its own lane: the healthy pods are read while it hangs
            assert ended[-1] == "127.0.0.1" and len(ended) == 4
            assert evaluator.suspects == {"127.0.0.1"}
    finally:
        for fake in fakes:
            fake.stop()


async def test_rounds_start_every_interval_however_long_a_round_takes() -> None:
    class SlowRounds:
        async def tick(self, session, now, spread=0.0) -> int:
            await asyncio.sleep(0.2)
            return 0

    starts: list[float] = []
    four = asyncio.Event()

    def on_round(started: float, _finished: float, _signals: int) -> None:
        starts.append(started)
        if len(starts) == 4:
            four.set()

    task = asyncio.create_task(
        run_evaluator(None, 0.3, evaluator=SlowRounds(), on_round=on_round)  # type: ignore[arg-type]
    )
    await asyncio.wait_for(four.wait(), 10)
    task.cancel()
    gaps = sorted(b - a for a, b in itertools.pairwise(starts))
    # a sleep of `interval` after each round would make the gaps 0.5 s
    assert 0.28 <= gaps[len(gaps) // 2] < 0.45, gaps


async def test_spread_pools_start_in_a_stable_order_over_the_spread(monkeypatch) -> None:
    products = ["NVIDIA-A100-SXM4-80GB", H100, "NVIDIA-L40S", "NVIDIA-H200"]
    kube = FakeKube()
    view = FakeView(nodes=[node(f"n{i}", p) for i, p in enumerate(products)])
    for name in ("b", "a"):
        view.add(mtpinference(name, {"model": "org/model", "tensorParallelSize": 8}))
    reconciler = Reconciler(kube, view, OperatorSettings())
    for _ in range(2):
        await reconciler.reconcile_all()
        view.deliver(kube, ready=True)
    for key in view.resource_keys():
        for p in products:
            view.pods[(key, p)] = {"pod": f"{key[1]}|{p}"}  # never scraped for real
    loop = asyncio.get_running_loop()
    starts: list[tuple[float, str]] = []

    async def note(session, ip, sem, port):
        starts.append((loop.time(), ip))
        return None, 0.0

    monkeypatch.setattr(evaluator_module, "scrape_pod_timed", note)
    evaluator = Evaluator(RollbackActions(kube, view, reconciler))
    orders = []
    for _ in range(2):
        starts.clear()
        t0 = loop.time()
        await evaluator.tick(None, evaluator_module.datetime.now(evaluator_module.UTC), 0.8)  # type: ignore[arg-type]
        orders.append([ip for _, ip in starts])
        offsets = [t - t0 for t, _ in starts]
        assert offsets == sorted(offsets) and len(offsets) == 8
        assert offsets[-1] >= 0.7 * 7 / 8 * 0.8  # spread over 0.8 s, one pool each 0.1 s
        assert all(b - a >= 0.05 for a, b in itertools.pairwise(offsets))
    assert orders[0] == orders[1] == sorted(orders[0])  # by resource, then product
