"""The real-size sweep's raw runs → bench/results/gpu/realsize.{json,md}.

    python3 bench/gpu/realsize_summary.py [--raw bench/results/gpu/raw] [--out bench/results/gpu]

Each folder under --raw is one device call as it came back ($OUT of `realsize.sh`): env.txt,
realsize.log, <kind>-results.json, <kind>-expositions.tar.gz, plus call.json written here when
the call was saved (card the reply named, seconds held, the command). Calls on the same card
(name, driver, vLLM, torch) and model kind are merged per K; a K measured twice keeps the later
call's figures. A call whose call.json says `"repeat": true` was run to see how far the same
points move between runs: its runs are kept apart (the sweep's "Run-to-run spread" table) and
change none of the sweep's figures or derivations.

Derived here, from the measured runs only (nothing modelled unless said):
- best K per concurrency at the reference acceptance, as measured output tokens/s (capacity
  is inside these figures: at a concurrency above what a K's KV cache holds, requests wait);
- the field report's K (6 on H100/H200) as a share of the best K's output at each concurrency;
- the sensitivity of the best K to the acceptance curve (levels 0.9 and 0.6);
- the tuner's cost model u(K) = base + K·perToken fitted per concurrency to the real
  seconds per request-step (u = wall seconds / (generated - accepted tokens), the estimator's
  definition) over K >= 1, with residuals;
- K=0 at batch 1 against the memory-bandwidth floor (weights read once per step).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = 0.8
# peak HBM bandwidth, bytes/s, from the vendors' data sheets (H100 SXM5 80GB HBM3; H200 141GB)
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}
FIELD_REPORT_K = {"H100": 6, "H200": 6}  # what the operator shipped before this sweep
CONCURRENCY_BANDS = ((1, 2, 1), (3, 8, 4), (9, 32, 16), (33, 4096, 64))  # (first, last, measured c)


def family(gpu_name: str) -> str:
    for fam in ("H200", "H100", "A100", "L40S"):
        if fam in gpu_name:
            return fam
    return gpu_name


def env_facts(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("nvidia-smi", "python", "torch", "vllm", "product", "cpus"):
            out[key.strip()] = value.strip()
    return out


def load_calls(raw: Path) -> list[dict]:
    calls = []
    for d in sorted(p for p in raw.iterdir() if p.is_dir()):
        env = env_facts((d / "env.txt").read_text()) if (d / "env.txt").exists() else {}
        meta = json.loads((d / "call.json").read_text()) if (d / "call.json").exists() else {}
        kinds = {}
        for f in sorted(d.glob("*-results.json")):
            res = json.loads(f.read_text())
            # a variant (e.g. vLLM's default compilation) is a sweep of its own
            name = res["kind"] + (f" ({res['variant']})" if res.get("variant") else "")
            kinds[name] = res
        if not kinds:  # not a realsize call (e.g. compile_cache.sh's): README says what it is
            continue
        calls.append({"name": d.name, "env": env, "meta": meta, "kinds": kinds})
    return calls


def gpu_key(env: dict) -> str:
    smi = env.get("nvidia-smi", "?")
    return " | ".join([smi, env.get("vllm", "?"), env.get("torch", "?")])


def merge(calls: list[dict]) -> dict:
    """{gpu key: {kind: {"servers": {k: server}, "runs": [...], "calls": [...]}}}"""
    out: dict = {}
    for call in calls:
        key = gpu_key(call["env"])
        for kind, res in call["kinds"].items():
            slot = out.setdefault(key, {}).setdefault(kind, {
                "servers": {}, "runs": {}, "calls": [], "config": res["config"],
                "method": res["method"], "extra_args": res["extra_args"],
                "prompt_len": res["prompt_len"], "max_tokens": res["max_tokens"],
                "max_model_len": res["max_model_len"], "env": call["env"]})
            ks = {s["k"] for s in res["servers"] if "ready_s" in s}
            if call["meta"].get("repeat"):
                for r in res["runs"]:
                    if r["k"] in ks and "error" not in r:
                        slot.setdefault("repeats", []).append({"call": call["name"], **r})
                slot.setdefault("repeat_calls", []).append(call["name"])
                continue
            for s in res["servers"]:
                if s["k"] in ks:
                    slot["servers"][s["k"]] = {a: b for a, b in s.items() if a != "log_tail"}
            for r in res["runs"]:
                if r["k"] in ks and "error" not in r:
                    slot["runs"][(r["k"], r["p_set"], r["concurrency"])] = r
            slot["calls"].append(call["name"])
    return out


def run_at(slot: dict, k: int, p: float, c: int) -> dict | None:
    return slot["runs"].get((k, p, c))


def largest(slot: dict, k: int) -> dict | None:
    big = [r for r in slot["runs"].values() if r["k"] == k and r.get("largest_batch_run")]
    return big[0] if big else None


def request_step_seconds(r: dict) -> float | None:
    """u: wall seconds per request-step, N = generated - accepted (tuning/estimator.py)."""
    n = (r.get("generation_tokens") or 0) - (r.get("accepted_tokens") or 0)
    return r["wall_s"] / n if n > 0 else None


def line_fit(points: list[tuple[float, float]]) -> dict | None:
    ks = sorted({k for k, _ in points})
    if len(ks) < 2:
        return None
    n = len(points)
    mx = sum(k for k, _ in points) / n
    my = sum(u for _, u in points) / n
    sxx = sum((k - mx) ** 2 for k, _ in points)
    beta = sum((k - mx) * (u - my) for k, u in points) / sxx
    alpha = my - beta * mx
    res = {int(k): u - (alpha + beta * k) for k, u in points}
    rms = math.sqrt(sum(v * v for v in res.values()) / n)
    return {"base_ms": alpha * 1e3, "per_token_ms": beta * 1e3,
            "residual_ms": {k: v * 1e3 for k, v in res.items()}, "rms_ms": rms * 1e3,
            "rms_share": rms / my if my else None}


def tau_curve(k: int, p: float) -> float:
    """Tokens per draft step when position j is right with p given the ones before it."""
    return 1.0 + sum(p ** j for j in range(1, k + 1))


def normalized(r: dict, k: int, p: float, out_tokens: int) -> float:
    """A run's output tokens/s at the acceptance curve p instead of the one it realised.

    Per request: one prefill step (one token), then out_tokens - 1 decode tokens at τ a step;
    the step cost does not depend on acceptance (the step runs K+1 tokens either way), so
    tokens/s scales with tokens per request-step: (1 + (n-1)/τ_realised) / (1 + (n-1)/τ_p).
    """
    tau = r.get("mean_acceptance_length") or 1.0
    n = out_tokens - 1
    return r["output_tokens_per_s"] * (1 + n / tau) / (1 + n / tau_curve(k, p))


def choose(slot: dict, p: float) -> dict:
    """The built-in default for a pool whose concurrency is not known: over each largest K
    M (vLLM sizes per-request draft state, and so capacity, for the largest K a schedule
    holds), each batch band gets the best K <= M at curve p; where M's own run at that
    concurrency had requests waiting, the band gets M's figure (capacity is M's whatever
    K the band runs). The M whose worst band keeps the largest share of that band's best
    single K wins (ties: the smaller M)."""
    ks = sorted(slot["servers"])
    n = slot["max_tokens"]
    bands = [(a, b, c) for a, b, c in CONCURRENCY_BANDS
             if all(run_at(slot, k, REFERENCE, c) for k in ks)]
    norm = {(k, c): normalized(run_at(slot, k, REFERENCE, c), k, p, n)
            for k in ks for _, _, c in bands}
    best = {c: max(norm[(k, c)] for k in ks) for _, _, c in bands}
    options = []
    for m in ks:
        sched, shares = [], []
        for a, b, c in bands:
            if (run_at(slot, m, REFERENCE, c) or {}).get("max_waiting", 0) > 0:
                kb, value = m, norm[(m, c)]
            else:
                kb = max((k for k in ks if k <= m), key=lambda k: norm[(k, c)])
                value = norm[(kb, c)]
            sched.append([a, b, kb])
            shares.append(value / best[c])
        options.append({"max_k": m, "schedule": sched, "shares": shares,
                        "worst_share": min(shares)})
    pick = max(options, key=lambda o: (round(o["worst_share"], 3), -o["max_k"]))
    merged: list[list[int]] = []
    for a, b, k in pick["schedule"]:
        if merged and merged[-1][2] == k:
            merged[-1][1] = b
        else:
            merged.append([a, b, k])
    field = FIELD_REPORT_K.get(family(slot["env"].get("nvidia-smi", "")))
    return {"curve_p": p, "k": max(k for _, _, k in merged),
            "schedule": merged if len(merged) > 1 else [], "worst_share": pick["worst_share"],
            "shares": dict(zip([c for _, _, c in bands], pick["shares"], strict=True)),
            "best_single": {c: max(ks, key=lambda k: norm[(k, c)]) for _, _, c in bands},
            "normalized": {f"k{k}-c{c}": v for (k, c), v in norm.items()},
            "field_k": field,
            "field_share": ({c: norm[(field, c)] / best[c] for _, _, c in bands}
                            if field in ks else None),
            "options": options}


def derive(slot: dict, gpu_name: str) -> dict:
    ks = sorted(slot["servers"])
    concs = sorted({c for (_, p, c) in slot["runs"] if p == REFERENCE})
    fam = family(gpu_name)
    best: dict = {}
    for c in concs:
        row = {k: run_at(slot, k, REFERENCE, c) for k in ks}
        tps = {k: r["output_tokens_per_s"] for k, r in row.items() if r}
        if not tps:
            continue
        kbest = max(tps, key=lambda k: tps[k])
        fr = FIELD_REPORT_K.get(fam)
        best[c] = {"best_k": kbest, "tok_s": tps[kbest], "by_k": tps,
                   "k0_share": tps.get(0, 0) / tps[kbest] if 0 in tps else None,
                   "field_k": fr,
                   "field_share": tps[fr] / tps[kbest] if fr in tps else None}
    sens: dict = {}
    for p in sorted({p for (_, p, _) in slot["runs"]}):
        for c in (1, 16):
            tps = {k: r["output_tokens_per_s"] for k in ks
                   if (r := run_at(slot, k, p, c))
                   or (k == 0 and (r := run_at(slot, 0, REFERENCE, c)))}
            if len(tps) > 1:
                kb = max(tps, key=lambda k: tps[k])
                sens[f"p{p:g}-c{c}"] = {"best_k": kb, "tok_s": tps[kb], "by_k": tps}
    fits: dict = {}
    for c in concs:
        pts = []
        for k in ks:
            r = run_at(slot, k, REFERENCE, c)
            u = request_step_seconds(r) if r else None
            if k >= 1 and u:
                pts.append((float(k), u))
        fit = line_fit(pts)
        if fit:
            r0 = run_at(slot, 0, REFERENCE, c)
            fit["k0_measured_ms"] = request_step_seconds(r0) * 1e3 if r0 else None
            fits[c] = fit
    floor = None
    s0 = slot["servers"].get(0)
    r0 = run_at(slot, 0, REFERENCE, 1)
    if s0 and r0 and s0.get("weights_gib") and fam in BANDWIDTH and r0.get("decode_step_ms_c1"):
        floor_ms = s0["weights_gib"] * 2**30 / BANDWIDTH[fam] * 1e3
        floor = {"weights_gib": s0["weights_gib"], "bandwidth_tb_s": BANDWIDTH[fam] / 1e12,
                 "floor_ms": floor_ms, "decode_step_ms": r0["decode_step_ms_c1"],
                 "fraction": floor_ms / r0["decode_step_ms_c1"]}
    bands = []
    for first, last, c in CONCURRENCY_BANDS:
        if c in best:
            bands.append([first, last, best[c]["best_k"]])
    defaults = {f"p{p:g}": choose(slot, p) for p in (REFERENCE, 0.9, 0.6)}
    return {"best_by_concurrency": best, "sensitivity": sens, "cost_fit": fits,
            "bandwidth": floor, "bands": bands, "defaults": defaults}


def fmt(x: object, nd: int = 1) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def spread_table(s: dict) -> list[str]:
    """The sweep's point next to each repeat of it (calls marked `"repeat": true`)."""
    reps = s.get("repeats") or []
    if not reps:
        return []
    md = ["", "### Run-to-run spread (repeat calls: " + ", ".join(s.get("repeat_calls", []))
          + "; not used above)", "",
          "Spread = (largest - smallest) / smallest ms per engine step over the sweep's run and "
          "the repeats.", "",
          "| K | p | c | sweep: tok/s (ms a step, requests) | repeats: tok/s (ms a step, "
          "requests) | spread of the step |", "|---|---|---|---|---|---|"]

    def cell(r: dict) -> str:
        return (f"{r['output_tokens_per_s']:.1f} ({fmt(r.get('time_per_engine_step_ms'))}, "
                f"{r.get('requests', '?')})")

    keys = sorted({(r["k"], r["p_set"], r["concurrency"]) for r in reps})
    for key in keys:
        base = s["runs"].get(key)
        rs = [r for r in reps if (r["k"], r["p_set"], r["concurrency"]) == key]
        steps = [x["time_per_engine_step_ms"] for x in ([base] if base else []) + rs
                 if x.get("time_per_engine_step_ms")]
        spread = (f"{100 * (max(steps) - min(steps)) / min(steps):.0f} %"
                  if len(steps) > 1 else "—")
        md.append(f"| {key[0]} | {key[1]:g} | {key[2]} | {cell(base) if base else '—'} | "
                  + "; ".join(cell(r) for r in rs) + f" | {spread} |")
    return md


def markdown(summary: dict) -> str:
    md = ["# MTP at real size: K x batch x acceptance on the lent GPUs", "",
          "Dummy weights (`--load-format dummy`), full-size configs, served through "
          "`mtp-runtime serve` (bench/gpu/realsize.py); acceptance set in place after the load "
          "(bench/gpu/acceptance_ext.py) so the draft agrees with the target on a chosen "
          f"per-position share p (reference p = {REFERENCE}). Each request: 64-token prompt, "
          "64 greedy output tokens (`ignore_eos`); at concurrency c, max(2, c) requests c at a "
          "time. Produced by `python3 bench/gpu/realsize_summary.py`; raw results, vLLM logs "
          "and every /metrics scrape under `raw/`.", ""]
    for gpu, kinds in summary["sweeps"].items():
        for kind, s in kinds.items():
            d = s["derived"]
            md += [f"## {kind} on {gpu}", "",
                   f"- calls: {', '.join(s['calls'])}; method `{s['method']}`; vLLM flags from "
                   f"`extraArgs`: `{' '.join(s['extra_args'])}`",
                   f"- max_model_len {s['max_model_len']}: vLLM's \"Maximum concurrency\" is for "
                   "that many tokens a request", ""]
            md += ["### Engine start and capacity per K", "",
                   "| K | ready (s) | weights GiB | KV cache tokens | max concurrency (x) | "
                   "max running / waiting at c=64 |", "|---|---|---|---|---|---|"]
            for k, sv in sorted(s["servers"].items()):
                r64 = run_at(s, k, REFERENCE, 64)
                rw = f"{r64['max_running']} / {r64['max_waiting']}" if r64 else "—"
                md.append(f"| {k} | {fmt(sv.get('ready_s'))} | {fmt(sv.get('weights_gib'), 2)} | "
                          f"{fmt(sv.get('kv_cache_tokens'))} | {fmt(sv.get('max_concurrency'), 2)} "
                          f"| {rw} |")
            concs = sorted({c for (_, p, c) in s["runs"] if p == REFERENCE})
            md += ["", f"### Output tokens/s at p = {REFERENCE} (ms per engine step)", "",
                   "| K | " + " | ".join(f"c={c}" for c in concs) + " | largest batch |",
                   "|---|" + "---|" * (len(concs) + 1)]
            for k in sorted(s["servers"]):
                cells = []
                for c in concs:
                    r = run_at(s, k, REFERENCE, c)
                    step = fmt(r["time_per_engine_step_ms"]) if r else ""
                    cells.append(f"{r['output_tokens_per_s']:.1f} ({step})" if r else "—")
                big = largest(s, k)
                cells.append(f"c={big['concurrency']}: {big['output_tokens_per_s']:.0f}"
                             if big else "—")
                md.append(f"| {k} | " + " | ".join(cells) + " |")
            md += ["", "### Acceptance: τ (mean acceptance length) and per-position acceptance", "",
                   "| K | p | c | output tok/s | τ | by position |", "|---|---|---|---|---|---|"]
            for (k, p, c), r in sorted(s["runs"].items()):
                if k == 0 or c not in (1, 16):
                    continue
                pos = ", ".join(f"{x:.2f}" for x in r.get("position_acceptance_rate") or [])
                md.append(f"| {k} | {p:g} | {c} | {r['output_tokens_per_s']:.1f} | "
                          f"{fmt(r.get('mean_acceptance_length'), 2)} | {pos} |")
            md += ["", "### Best K per concurrency (measured, capacity included)", "",
                   "| c | best K | tok/s | K=0 as share | field report's K | its share |",
                   "|---|---|---|---|---|---|"]
            for c, b in d["best_by_concurrency"].items():
                md.append(f"| {c} | {b['best_k']} | {b['tok_s']:.1f} | {fmt(b['k0_share'], 2)} | "
                          f"{fmt(b['field_k'])} | {fmt(b['field_share'], 2)} |")
            md += ["", "Sensitivity to the acceptance curve: " + "; ".join(
                f"{key}: best K {v['best_k']}" for key, v in d["sensitivity"].items()), ""]
            md += ["### The default derived (bench/gpu/realsize_summary.py `choose`)", "",
                   "Output tokens/s re-scaled from the acceptance each run realised to a "
                   "curve (position j right with p given the ones before: τ(K) = 1 + p + ... "
                   "+ p^K), since two requests at c=1 realise it with noise. Rule: vLLM sizes "
                   "per-request draft state for the largest K, so for each largest K M every "
                   "band gets the best K <= M, or M's own figure where M's run had requests "
                   "waiting; the M whose worst band keeps the largest share of that band's "
                   "best single K is the default.", "",
                   "| curve p | default K | schedule | worst band's share | share by c | best "
                   "single K by c | field report's K share by c |", "|---|---|---|---|---|---|---|"]
            for dd in d["defaults"].values():
                sched = "; ".join(f"{a}-{b}: {k}" for a, b, k in dd["schedule"]) or "one K"
                shares = ", ".join(f"{c}: {v:.2f}" for c, v in dd["shares"].items())
                singles = ", ".join(f"{c}: {k}" for c, k in dd["best_single"].items())
                field = (", ".join(f"{c}: {v:.2f}" for c, v in dd["field_share"].items())
                         if dd["field_share"] else "—")
                md.append(f"| {dd['curve_p']:g} | {dd['k']} | {sched} | "
                          f"{dd['worst_share']:.2f} | {shares} | {singles} | {field} |")
            md.append("")
            md += ["### The tuner's cost model at real size: u(K) = base + K·perToken", "",
                   "u = seconds per request-step (wall / (generated - accepted)); fitted over "
                   "K ≥ 1 per concurrency; residual = measured - fit.", "",
                   "| c | base ms | per token ms | u(0) measured ms | rms residual | "
                   "residuals ms by K |",
                   "|---|---|---|---|---|---|"]
            for c, f in d["cost_fit"].items():
                res = ", ".join(f"{k}: {v:+.3f}" for k, v in sorted(f["residual_ms"].items()))
                md.append(f"| {c} | {f['base_ms']:.3f} | {f['per_token_ms']:.3f} | "
                          f"{fmt(f['k0_measured_ms'], 3)} | {100 * f['rms_share']:.1f} % | {res} |")
            md += spread_table(s)
            bw = d["bandwidth"]
            if bw:
                md += ["", f"K=0 at batch 1: {bw['decode_step_ms']:.2f} ms a decode step; reading "
                       f"{bw['weights_gib']:.2f} GiB of weights at {bw['bandwidth_tb_s']:.2f} TB/s "
                       f"takes at least {bw['floor_ms']:.2f} ms: {100 * bw['fraction']:.0f} % of "
                       "the bandwidth limit."]
            md.append("")
    md += ["## Device calls", "", "| call | card (as the reply named it) | seconds | command |",
           "|---|---|---|---|"]
    for c in summary["calls"]:
        m = c["meta"]
        command = m.get("command", "?").replace("|", chr(92) + "|")
        md.append(f"| {c['name']} | {m.get('device', c['env'].get('nvidia-smi', '?'))} | "
                  f"{m.get('seconds', '?')} | `{command}` |")
    return "\n".join(md) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--raw", type=Path, default=ROOT / "bench/results/gpu/raw")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/gpu")
    args = ap.parse_args()
    calls = load_calls(args.raw)
    merged = merge(calls)
    sweeps: dict = {}
    for gpu, kinds in merged.items():
        for kind, slot in kinds.items():
            d = derive(slot, gpu)
            sweeps.setdefault(gpu, {})[kind] = {**slot, "derived": d}
    summary = {"reference_p": REFERENCE, "calls": [
        {"name": c["name"], "env": c["env"], "meta": c["meta"]} for c in calls],
        "sweeps": sweeps}

    def jsonable(o: object) -> object:
        if isinstance(o, dict):
            return {(f"k{k[0]}-p{k[1]:g}-c{k[2]}" if isinstance(k, tuple) else str(k)):
                    jsonable(v) for k, v in o.items()}
        if isinstance(o, list):
            return [jsonable(v) for v in o]
        if isinstance(o, float):
            return round(o, 5)
        return o

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "realsize.json").write_text(json.dumps(jsonable(summary), indent=1) + "\n")
    (args.out / "realsize.md").write_text(markdown(summary))
    print(f"wrote {args.out / 'realsize.json'} and realsize.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
