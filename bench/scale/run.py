#!/usr/bin/env python3
"""Scale benchmark of the operator on a dedicated local sandbox (`make bench`).

A sandbox of its own (state in $MTP_BENCH_SANDBOX_DIR, default <tmp>/mtp-bench-sandbox) with
--nodes-per-product simulated 8-GPU nodes for each of the 4 sandbox GPU products (default 125,
so 500 nodes and 1,000 GPUs per product) from a generated nodes file. Then, in this order:

floor       A plain client (lightkube, server-side apply, --concurrency requests in flight)
            creates the objects the operator would create for --resources MTPInferences
            (`mtp-operator render`: one Service and one pool Deployment per GPU product each,
            owner references removed) in namespace bench-floor, and waits until every
            Deployment has all replicas ready. No operator runs.
baseline    --window seconds with those objects in place and nobody acting: the API requests
            the controllers, scheduler and kwok make on their own (subtracted below).
operator    bench-floor is deleted (its pods gone); the operator (`mtp-operator run`,
            cluster-wide, evaluator off) is started, the same client applies --resources
            MTPInferences (TP=1, replicas 1) to bench-op, and waits until each reports
            status.phase Ready for its generation. Ratio: operator time / floor time.
steady      --window seconds with nothing changing: the operator's write counters and the
            API server's write requests (target: 0 from the operator).
restart     The operator is stopped (SIGTERM) and started again with nothing changed: time
            until /readyz, until every resource was reconciled, until its reconcile counter
            stops moving; writes meanwhile (target: 0).
            floor and operator run --rounds times (default 2), alternating; the ratio is of
            their medians (the machine is shared: single runs vary by tens of percent).
reaction    bench/reaction/reaction.py's main() if that file exists (alert -> patch timing), on the
            same sandbox after bench-op is deleted.

Measured: wall times; the operator's CPU seconds (utime+stime) and peak RSS (VmHWM) from
/proc; CPU seconds of each sandbox component; API requests by verb from the kube-apiserver's
own /metrics (apiserver_request_total, all clients, deltas per phase; server-side apply
counts as verb APPLY), and the operator's own requests exactly from the API server's audit
log (the sandbox audits ServiceAccount requests; the operator runs as one, cluster-admin).
The kube-controller-manager gets --kube-api-qps --kcm-qps (default 200): at its default of
20 the controller manager, not the operator or the client, paces both runs.

Results: bench/results/scale.json and scale.md (table, machine, date; README.md instead when
--out is a folder of its own).

evaluator   bench/scale/scale_evaluator.py's main() (the built-in evaluator at 4,000 pods against a
            bare client; results in bench/results/evaluator.json and evaluator.md).

    python bench/scale/run.py                     # full size: 500 nodes, 1,000 resources
    python bench/scale/run.py --resources 20 --nodes-per-product 3 --window 10 \
        --reaction-args "" --evaluator-args "--resources 20 --rounds 2"   # quick try
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from profiling import require_py_spy
from scale_bench import Bench
from scale_common import REPO
from scale_results import markdown, write_results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--resources", type=int, default=1000)
    p.add_argument("--nodes-per-product", type=int, default=125)
    p.add_argument("--concurrency", type=int, default=16, help="client requests in flight")
    p.add_argument("--window", type=float, default=60, help="baseline/steady seconds")
    p.add_argument(
        "--rounds", type=int, default=2, help="floor + operator runs (the ratio uses medians)"
    )
    p.add_argument(
        "--kcm-qps",
        type=int,
        default=200,
        help="kube-controller-manager --kube-api-qps (burst twice that); 0: its default 20",
    )
    p.add_argument("--timeout", type=float, default=900, help="per wait, seconds")
    p.add_argument(
        "--sandbox-dir",
        default=os.environ.get("MTP_BENCH_SANDBOX_DIR")
        or str(Path(tempfile.gettempdir()) / "mtp-bench-sandbox"),
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--keep", action="store_true", help="leave the sandbox running")
    p.add_argument("--skip-reaction", action="store_true")
    p.add_argument(
        "--reaction-args",
        default="--resources 25 --alerts 200",
        help="for bench/reaction/reaction.py: 25 x 4 = 100 pools for the burst, 200 single alerts",
    )
    p.add_argument("--skip-rollout", action="store_true")
    p.add_argument("--skip-evaluator", action="store_true")
    p.add_argument(
        "--evaluator-args", default="",
        help="for bench/scale/scale_evaluator.py, e.g. '--resources 50'",
    )
    p.add_argument("--rewrite", action="store_true", help="only rewrite the .md from scale.json")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="py-spy the operator through each rollout round and the restart (raw stacks in "
        "DIR; the summaries go into scale.json as rollout_profiles: round1.., restart)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rewrite:  # the Markdown again from scale.json (after editing the text here)
        write_results(json.loads((args.out / "scale.json").read_text()), args.out)
        return 0
    if args.profile is not None and not args.skip_rollout:
        require_py_spy()  # now, not after the floor phase has run for minutes
    # stop cleanly (sandbox down, operator stopped) however we are told to stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not args.skip_rollout:
        result = Bench(args).run()
        print(markdown(result))
    if not args.skip_evaluator:  # its own processes, no sandbox (it is down by now)
        import scale_evaluator

        scale_evaluator.main(["--out", str(args.out), *args.evaluator_args.split()])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
