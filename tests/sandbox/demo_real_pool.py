"""The real-engine part of `make demo`: one pool served by the real runtime and vLLM engine.

    python tests/sandbox/demo_real_pool.py --namespace mtp-demo --resource deepseek-v3 \
        --product NVIDIA-L40S --vllm VLLM --model MODEL --log-dir DIR [--healthy-seconds 12]

Plays kubelet for that pool's pod (tests/support/real_pool.py: the pod's own `mtp-runtime
serve` and MTP_RUNTIME_CONFIG, the tiny MTP model in place of the spec's model, bound to the
pod IP), sends real greedy traffic of class `predictable` (tests/engine/traffic.py) and prints
the real hit rate from the engine's own counters; then switches to `unpredictable`, waits for
the operator to roll the pool's K back, switches back, waits for the runtime of the new pod to
start a new real engine, and prints its counters (draft tokens / drafts == the new K). Stops
every engine it started before it exits. Exit status 1 with the reason on any timeout.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

from mtp_runtime.figures import figures_from_increase  # noqa: E402
from support.pool_fakes import PoolWatch  # noqa: E402
from support.real_pool import EngineRun, RealPool  # noqa: E402
from support.real_traffic import Traffic  # noqa: E402


def rate(run: EngineRun, t0: float, t1: float) -> tuple[float | None, float]:
    inc = run.between(t0, t1)
    if inc is None or not inc.drafts:
        return None, 0.0
    return figures_from_increase(inc)["hit_rate"], inc.drafts  # type: ignore[return-value]


def show(label: str, hr: float | None, drafts: float, threshold: float) -> None:
    verdict = "-" if hr is None else ("healthy" if hr >= threshold else "below threshold")
    shown = "n/a" if hr is None else f"{hr:.3f}"
    print(f"  {label:<34} hit rate {shown:>5} over {drafts:5.0f} drafts  ({verdict})",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("namespace", "resource", "product", "vllm", "model", "log-dir"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--kubeconfig", default=None)
    ap.add_argument("--healthy-seconds", type=float, default=12)
    ap.add_argument("--threshold", type=float, default=0.88)
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds for each engine start (minutes on a busy machine)")
    args = ap.parse_args(argv)
    # SIGTERM (the demo's cleanup) unwinds like Ctrl-C, so every engine started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    kubeconfig = args.kubeconfig or os.environ["KUBECONFIG"]
    events: list[str] = []

    def event(msg: str) -> None:
        events.append(msg)
        print(f"  [kubelet] {msg}", flush=True)

    pool = RealPool(kubeconfig, args.namespace, args.resource, args.product, vllm=args.vllm,
                    model=args.model, log_dir=args.log_dir, on_event=event)
    product = args.product
    with PoolWatch(kubeconfig, args.namespace) as watch, pool, \
            Traffic(pool, "predictable", concurrency=4) as load:
        try:
            old = pool.wait_engine(next(c.k for c in watch.changes if c.product == product),
                                   timeout=args.timeout)
        except (TimeoutError, RuntimeError) as err:
            print(f"real engine did not start: {err}")
            return 1
        print(f"real engine (K={old.k}) started in {old.start_seconds:.1f} s; "
              f"traffic: predictable (greedy token-id prompts)", flush=True)
        pool.wait_counters(old, drafts=1)
        t0 = time.monotonic()
        while time.monotonic() < t0 + args.healthy_seconds:
            time.sleep(3)
            show("predictable, last 3 s:", *rate(old, time.monotonic() - 3, time.monotonic()),
                 args.threshold)
        hr_before, n_before = rate(old, t0, time.monotonic())
        show(f"predictable, {args.healthy_seconds:.0f} s in all:", hr_before, n_before,
             args.threshold)
        if watch.since(0):
            print(f"a pool changed on healthy traffic: {watch.since(0)}")
            return 1

        t_switch = load.switch("unpredictable")
        print(f"traffic switched to unpredictable (random token ids): waiting for the operator "
              f"to roll the {product} pool back", flush=True)
        change = None
        while change is None and time.monotonic() < t_switch + 90:
            try:
                change = watch.wait(lambda c: c.product == product, after=t_switch, timeout=2)
            except TimeoutError:
                show("unpredictable, last 2 s:",
                     *rate(old, time.monotonic() - 2, time.monotonic()), args.threshold)
        if change is None:
            print("no rollback 90 s after the switch")
            return 1
        load.switch("predictable")
        print(f"operator rolled the {product} pool back to K={change.k} "
              f"{change.t - t_switch:.1f} s after the switch", flush=True)
        try:
            new = pool.wait_engine(change.k, timeout=args.timeout)
            counters = pool.wait_counters(new, drafts=50)
        except (TimeoutError, RuntimeError) as err:
            print(f"no real engine with K={change.k}: {err}")
            return 1
        t_end = old.stopped_at or time.monotonic()
        hr_after, n_after = rate(old, t_switch, t_end)
        after = "n/a" if hr_after is None else f"{hr_after:.3f}"
        print(f"real hit rate of the old engine (K={old.k}): {hr_before or 0:.3f} before the "
              f"switch ({n_before:.0f} drafts), {after} after it ({n_after:.0f} drafts)")
        print(f"new real engine (K={new.k}) started in {new.start_seconds:.1f} s; its counters: "
              f"{counters.draft_tokens:.0f} draft tokens / {counters.drafts:.0f} drafts = "
              f"{counters.draft_tokens / counters.drafts:g} tokens per draft = K", flush=True)
        if counters.draft_tokens != new.k * counters.drafts:
            print(f"the new engine's counters do not show K={new.k}")
            return 1
    if pool.errors:
        print(f"real pool errors: {pool.errors}")
        return 1
    print(f"real engines stopped ({len(pool.runs)} started: K "
          f"{' then '.join(str(r.k) for r in pool.runs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
