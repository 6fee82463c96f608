"""Scale benchmark: scale.json and its Markdown (README.md in a run's own folder, scale.md in
bench/results/, whose README.md is the index of every benchmark's current figures)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scale_common import WRITE_COUNTERS, log
from scale_measure import writes_only

TARGET_RATIO = 1.2
TARGET_WRITES = 1.25
TARGET_RSS_MIB = 250
TARGET_RESTART_SECONDS = 10
NOTES = [
    "Everything shares the machine's CPUs: etcd, kube-apiserver, controller manager, "
    "scheduler, kwok, the operator and the benchmark client. The operator's CPU (and the "
    "API server's work for its requests) directly slows the controllers it waits for.",
    "The machine is shared with other work; single runs of the same phase varied by tens of "
    "percent (a floor run took 42 s in one run and 74 s in the next), hence rounds and "
    "medians. 'CPU-s taken by other work' above is what the rest of the machine used "
    "meanwhile.",
    "At the issue's full size (1,000 resources, 500 nodes, 4,000 Deployments) the floor "
    "alone did not finish on 2026-12-01: with two real vLLM engines and a second sandbox of "
    "other work on the same 2 CPUs (load average 17-20), the bare client's 5,000 applies "
    "took 4.5 minutes and 284 of the 4,000 Deployments were ready after 9 minutes (two "
    "attempts, stopped); at 250 resources (1,000 Deployments) 131 were ready after 2.5 "
    "minutes (stopped). This run is at the size that fitted the time left, with the same "
    "code; the machine was as loaded (see 'CPU-s taken by other work').",
    "kube-controller-manager runs with --kube-api-qps 200 (burst 400). At the sandbox "
    "default (20, burst 30) the controller manager's client rate limit paces both runs: in "
    "a first attempt at the default, 30 of the floor's 1,200 Deployments were ready after "
    "3 minutes.",
    "The operator's requests come from the audit log, exact; apiserver_request_total has no "
    "client label. Watch events the operator receives are not requests and are not counted; "
    "they cost it CPU (kopf handles every Deployment and pod event of every pool).",
]


RESULTS = Path(__file__).resolve().parents[1] / "results"  # the other benches' results


def write_results(r: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(r, indent=1, sort_keys=False) + "\n")
    # a dated folder under bench/results links to the others' results one level up
    md = out / ("scale.md" if out.resolve() == RESULTS else "README.md")
    md.write_text(markdown(r, Path(os.path.relpath(RESULTS, out.resolve()))))
    log(f"wrote {out / 'scale.json'} and {md}")


def _verbs(d: Mapping[str, int]) -> str:
    return ", ".join(f"{v} {n}" for v, n in d.items() if n) or "none"


def _gc_note(phase: dict[str, Any]) -> str:
    """', of which the garbage collector X s (full passes Y s), whole life so far' when the
    run recorded it (mtp_operator_gc_seconds_total; runs before 2026-12-04 did not)."""
    gc_s = phase.get("operator_gc_seconds")
    if not gc_s:
        return ""
    return (f"; of it the garbage collector {gc_s['all']} s, its full passes {gc_s['full']} s "
            "(process life so far)")


def _mark(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def _writes_rows(r: dict[str, Any]) -> list[str]:
    """The operator's rollout writes (audit) against the minimum, each round."""
    rounds = [x["operator_writes"] for x in r["rounds"] if "operator_writes" in x]
    if not rounds:
        return []
    w = r["operator"]["writes"]
    worst = max(x["ratio"] for x in rounds)
    return [
        "| operator writes during the rollout (audit; Events apart), last round: "
        + ", ".join(f"{k} {n}" for k, n in w["by_resource"].items())
        + f" | {w['total']} ({w['status_writes_per_resource']} status writes a resource) | |",
        f"| minimum carrying the same information: one apply per Deployment and Service, two "
        f"status writes per resource | {w['minimum']} | |",
        "| ratio writes / minimum, each round (failed requests included; without them) | "
        + ", ".join(
            f"{x['ratio']:.3f}x ({x.get('ratio_succeeded', x['ratio']):.3f}x)" for x in rounds
        )
        + f" | <= {TARGET_WRITES}x: {_mark(worst <= TARGET_WRITES)} |",
        f"| Events posted during the rollout (last round) | {w['events']} | |",
    ]


def _cpu_rows(r: dict[str, Any]) -> list[str]:
    """CPU-s by process in every round (runs before 2026-12-03 kept only the last round's)."""
    rounds = [x["cpu_seconds"] for x in r["rounds"] if "cpu_seconds" in x]
    if not rounds:
        return []

    def one(c: Mapping[str, float], keys: tuple[str, ...]) -> str:
        return " / ".join(f"{c.get(k, 0):.1f}" for k in keys)

    op_keys = ("machine_total", "operator", "kube-apiserver", "etcd")
    fl_keys = ("machine_total", "kube-apiserver", "etcd")
    return [
        "| CPU-s per round, operator phase (machine / operator / kube-apiserver / etcd); floor "
        "(machine / kube-apiserver / etcd) | "
        + "; ".join(
            f"round {i + 1}: {one(c['operator'], op_keys)}; {one(c['floor'], fl_keys)}"
            for i, c in enumerate(rounds)
        )
        + " | |"
    ]


def _profile_lines(r: dict[str, Any]) -> list[str]:
    """The operator's py-spy profile per rollout round and of the restart (`--profile DIR`)."""
    profiles = r.get("rollout_profiles") or {}
    out: list[str] = []
    for name, prof in profiles.items():
        spy = prof.get("py_spy")
        if not spy:
            continue
        if not out:
            out = ["## Where the operator's CPU went in the rollout and the restart (py-spy, "
                   "`--profile`)", ""]
        areas = ", ".join(f"{a['area']} {a['share']:.0%}" for a in spy["by_area"][:8])
        top = ", ".join(f"{f['function']} ({f['file']}) {f['share']:.1%}" for f in spy["self"][:8])
        ours = ", ".join(f"{f['function']} {f['share']:.1%}" for f in spy["inclusive"][:8])
        out += [
            f"- {name}: {spy['cpu_s']} CPU-s sampled; by library (self): {areas}",
            f"  - top functions (self): {top}",
            f"  - our functions (inclusive): {ours}",
        ]
    return [*out, ""] if out else []


def markdown(r: dict[str, Any], results: Path = Path(".")) -> str:
    """The scale run as Markdown; `results` is where the other benches' results are, as
    seen from the folder this text goes into."""
    s, m = r["settings"], r["machine"]

    def other(name: str) -> str:
        return f"[{name}]({(results / name).as_posix()})"

    fl, op, st, rs = r["floor"], r["operator"], r["steady"], r["restart"]
    ratio = r["ratio_operator_to_floor"]
    steady_counted = sum(st["operator_counter_deltas"][k] for k in WRITE_COUNTERS)
    steady_api = writes_only(st["operator_requests_by_verb"])
    restart_counted = sum(rs["operator_counters"][k] for k in WRITE_COUNTERS)
    restart_api = writes_only(rs["operator_requests_by_verb"])
    counters = op["operator_counters"]
    lines = [
        "# Scale benchmark",
        "",
        f"Scale run of {r['started'][:10]} (`make bench` = `python bench/scale/run.py`; raw "
        "figures in [scale.json](scale.json)). The built-in evaluator at 4,000 pods: "
        f"{other('evaluator.md')} (bench/scale/scale_evaluator.py, run by bench/scale/run.py after "
        "this; sources keeping connections 75 s, as mtp-runtime starts vLLM), and at vLLM's "
        f"default keep-alive of 5 s: {other('evaluator-keepalive-5s.md')}. "
        f"Alert -> patch timing and webhook bursts: {other('reaction.md')} "
        "(bench/reaction/reaction.py, run by bench/scale/run.py on the same sandbox). Pool "
        f"restarts with and without a model cache: {other('model-cache.md')} (`make bench-cache`).",
        "",
        f"Sandbox: {s['nodes']} kwok nodes ({s['nodes'] // len(s['gpu_products'])} per GPU "
        f"product x {len(s['gpu_products'])} products, {s['gpus_per_node']} GPUs each); "
        f"kube-controller-manager --kube-api-qps {s['kube_controller_manager_qps']}. "
        f"{s['resources']} MTPInferences (TP={s['tensor_parallel_size']}, replicas "
        f"{s['replicas']}) -> {op['deployments']} pool Deployments + {s['resources']} Services. "
        f"Client for both runs: lightkube server-side apply, {s['client_concurrency']} requests "
        "in flight. The operator runs cluster-wide, evaluator off, as a ServiceAccount, so the "
        "API server's audit log gives its requests exactly.",
        "",
        "| measure | figure | target |",
        "|---|---|---|",
        f"| time to Ready, operator (last round): apply {s['resources']} MTPInferences -> "
        f"every status.phase Ready | {op['seconds']:.1f} s "
        f"(p50 {op['ready_after_seconds'].get('p50')} s) | |",
        f"| time to Ready, floor (last round): apply {fl['objects']} pre-rendered objects -> every "
        f"Deployment ready | {fl['seconds']:.1f} s (p50 {fl['ready_after_seconds'].get('p50')} "
        "s) | |",
        f"| ratio operator / floor, median of {len(r['rounds'])} rounds each ("
        + ", ".join(
            f"{x['operator_seconds']:.1f} s / {x['floor_seconds']:.1f} s" for x in r["rounds"]
        )
        + f") | {ratio:.2f}x | <= {TARGET_RATIO}x: {_mark(ratio <= TARGET_RATIO)} |",
        "| CPU-s taken by other work on the machine meanwhile, per round (operator / floor) | "
        + ", ".join(
            f"{x['other_load_cpu_seconds']['operator']:.0f} / "
            f"{x['other_load_cpu_seconds']['floor']:.0f}"
            for x in r["rounds"]
            if "other_load_cpu_seconds" in x
        )
        + " | |",
        *_cpu_rows(r),
        *_writes_rows(r),
        f"| operator CPU during the run{_gc_note(op)} | {op['operator_cpu_seconds']} s | |",
        f"| operator peak RSS (VmHWM, whole life so far; restart: "
        f"{rs['operator_peak_rss_mib']} MiB) | {op['operator_peak_rss_mib']} MiB | <= "
        f"{TARGET_RSS_MIB} MiB: {_mark(max(op['operator_peak_rss_mib'], rs['operator_peak_rss_mib']) <= TARGET_RSS_MIB)} |",  # noqa: E501
        f"| operator's own counters during the run | {counters['reconciles']:.0f} reconcile "
        f"passes, {counters['deployment_writes']:.0f} Deployment applies, "
        f"{counters['status_writes']:.0f} status patches | |",
        f"| operator's API requests during the run (audit) | "
        f"{_verbs(op['operator_requests_by_verb'])} | |",
        f"| steady state ({s['window_seconds']:.0f} s): operator writes, its counters | "
        f"{steady_counted:.0f} | 0: {_mark(steady_counted == 0)} |",
        f"| steady state: operator's API writes (audit) | {_verbs(steady_api)} | "
        f"0: {_mark(not steady_api)} |",
        f"| steady state: operator's API requests, all (audit) | "
        f"{_verbs(st['operator_requests_by_verb'])} | |",
        f"| steady state: operator CPU | {st['operator_cpu_seconds']} s | |",
        f"| restart, nothing changed: until /readyz | {rs['ready_seconds']:.1f} s | |",
        f"| restart: until every resource was reconciled (from the start of the process) | "
        f"{rs['all_resources_reconciled_seconds']} s | <= {TARGET_RESTART_SECONDS} s: "
        f"{_mark((rs['all_resources_reconciled_seconds'] or 1e9) <= TARGET_RESTART_SECONDS)} |",
        f"| restart: until the reconcile counter stopped moving | "
        f"{rs['reconcile_counter_settled_seconds']:.1f} s "
        f"({rs['operator_counters']['reconciles']:.0f} passes) | |",
        f"| restart: operator writes, its counters | {restart_counted:.0f} | 0: "
        f"{_mark(restart_counted == 0)} |",
        f"| restart: operator's API writes (audit) | {_verbs(restart_api)} | "
        f"0: {_mark(not restart_api)} |",
        f"| restart: operator's API requests, all (audit) | "
        f"{_verbs(rs['operator_requests_by_verb'])} | |",
        f"| restart: operator CPU / peak RSS{_gc_note(rs)} | {rs['operator_cpu_seconds']} s / "
        f"{rs['operator_peak_rss_mib']} MiB | |",
        "",
        "## API requests by verb (kube-apiserver's apiserver_request_total, all clients)",
        "",
        "Server-side apply counts as APPLY. The operator's share is from the audit log (its "
        "verbs are the audit log's: create = POST, patch = PATCH and APPLY).",
        "",
        "| phase | seconds | all clients | of which the operator |",
        "|---|---|---|---|",
        f"| floor: client + controllers + scheduler + kwok | {fl['seconds']:.1f} | "
        f"{_verbs(fl['requests_by_verb'])} | (not running) |",
        f"| baseline: nobody acting | {r['baseline']['seconds']:.1f} | "
        f"{_verbs(r['baseline']['requests_by_verb'])} | (not running) |",
        f"| operator: client + operator + controllers + ... | {op['seconds']:.1f} | "
        f"{_verbs(op['requests_by_verb'])} | {_verbs(op['operator_requests_by_verb'])} |",
        f"| steady | {st['seconds']:.1f} | {_verbs(st['requests_by_verb'])} | "
        f"{_verbs(st['operator_requests_by_verb'])} |",
        f"| restart | {rs['seconds']:.1f} | {_verbs(rs['requests_by_verb'])} | "
        f"{_verbs(rs['operator_requests_by_verb'])} |",
        "",
        f"The operator's requests in the run by resource: {_verbs(op['operator_requests'])}.",
        "",
        "CPU seconds by process in the operator run: "
        + ", ".join(f"{k} {v}" for k, v in op["cpu_seconds"].items())
        + "; in the floor run: "
        + ", ".join(f"{k} {v}" for k, v in fl["cpu_seconds"].items())
        + ".",
        "",
    ]
    lines += _profile_lines(r)
    lines += ["## Notes", "", *[f"- {n}" for n in r.get("notes") or NOTES], ""]
    lines += [
        "## Machine",
        "",
        f"{m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, Linux {m['kernel']}, "
        f"Python {m['python']}, kube-apiserver {m['kube_apiserver']} (sandbox: etcd, "
        "kube-apiserver, kube-controller-manager, kube-scheduler and kwok on the same machine "
        "as the operator and the client), "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
        + f". Run {r['started']} to {r.get('finished', '?')}.",
        "",
    ]
    return "\n".join(lines)
