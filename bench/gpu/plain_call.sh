#!/usr/bin/env bash
# One plain device call of the real-size work (no kind named, so an H200 or an H100 may come),
# from the repository root on the GPU machine with .gpu-carry carried. The card decides:
#
#   H200: the 27B-class hybrid sweep, K in SWEEP_KS order (results in $OUT as realsize.sh
#         writes them), skipping every K this machine already swept in an earlier call (a warm
#         machine keeps /tmp/plain-call/done); then, in what is left of CALL_BUDGET_S (seconds
#         from this script's start; 0: no repeat), a repeat of the leading K at REPEAT_ARGS
#         (results in $OUT/repeat: a call of its own when saved, `"repeat": true`). REPEAT_KS=auto picks them from every sweep result this
#         machine holds: the K `choose` (realsize_summary.py) ranks first, the field report's
#         K=6, then the next ones by worst-band share, at most REPEAT_MAX.
#   other: H100_KS / H100_ARGS / H100_BUDGET_S through realsize.sh (the H100 branch;
#         H100_BUDGET_S=0: record the machine and stop, so the machine can be given back).
#
# realsize.py takes each K's time as the estimate for the next (at least half the last
# estimate): on a cold machine the first K takes ~200 s (Triton compiles and autotunes), so a
# second K runs only where ~200 s of budget are left after the first (2026-12-07-h100-call1
# skipped its K=3 with 320 s; it ran in a warm call after).
#
#   SWEEP_KS=0,3,6,1,2,4,5 SWEEP_ARGS='--side-ks 3,6' SWEEP_BUDGET_S=560 \
#   H100_KS=2,3 H100_ARGS='--levels 0.8 --concurrency 4,16 --min-requests 16' H100_BUDGET_S=440 \
#   bash bench/gpu/plain_call.sh
set -u
OUT="${OUT:-/tmp/mtp-out}"
mkdir -p "$OUT"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE=/tmp/plain-call
mkdir -p "$STATE/raw"
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
card="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "card: $card (warm state: $(cat "$STATE/done" 2>/dev/null | tr '\n' ' '))"

if ! echo "$card" | grep -q H200; then
  echo h100 > "$OUT/branch.txt"
  REALSIZE_KINDS=qwen35-27b REALSIZE_KS="${H100_KS:-2,3}" \
    REALSIZE_ARGS="${H100_ARGS:---levels 0.8 --concurrency 4,16 --min-requests 16 --per-k-estimate 150}" \
    REALSIZE_BUDGET_S="${H100_BUDGET_S:-440}" bash .gpu-carry/realsize.sh
  exit 0
fi

echo h200 > "$OUT/branch.txt"
todo=""
for k in $(echo "${SWEEP_KS:-0,3,6,1,2,4,5}" | tr ',' ' '); do
  grep -qx "$k" "$STATE/done" 2>/dev/null || todo="$todo${todo:+,}$k"
done
n=$(ls "$STATE/raw" | wc -l)
if [ -n "$todo" ] && [ "${SWEEP_BUDGET_S:-560}" -gt 90 ]; then
  echo "sweep: K=$todo"
  REALSIZE_KINDS=qwen35-27b REALSIZE_KS="$todo" REALSIZE_ARGS="${SWEEP_ARGS:---side-ks 3,6}" \
    REALSIZE_BUDGET_S="${SWEEP_BUDGET_S:-560}" OUT="$OUT" bash .gpu-carry/realsize.sh
  if [ -f "$OUT/qwen35-27b-results.json" ]; then
    mkdir -p "$STATE/raw/call$n" && cp "$OUT/env.txt" "$OUT/qwen35-27b-results.json" "$STATE/raw/call$n/"
    python3 - "$OUT/qwen35-27b-results.json" >> "$STATE/done" <<'EOF'
import json, sys
res = json.load(open(sys.argv[1]))
ks = {s["k"] for s in res["servers"] if "ready_s" in s and "error" not in s}
for k in sorted(ks):
    if all("error" not in r for r in res["runs"] if r["k"] == k):
        print(k)
EOF
  fi
else
  echo "sweep: nothing left of K=${SWEEP_KS:-0,3,6,1,2,4,5} on this machine"
fi

RB=$(( ${CALL_BUDGET_S:-0} - ($(date +%s) - T0) ))
if [ "${CALL_BUDGET_S:-0}" -gt 0 ] && [ "$RB" -gt 100 ]; then
  ks="${REPEAT_KS:-auto}"
  if [ "$ks" = auto ]; then
    ks=$(python3 - "$ROOT/bench/gpu" "$STATE/raw" "${REPEAT_MAX:-3}" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import realsize_summary as rs
merged = rs.merge(rs.load_calls(Path(sys.argv[2])))
slot = next(iter(merged.values()))["qwen35-27b"]
got = rs.choose(slot, rs.REFERENCE)
ranked = [o["max_k"] for o in sorted(got["options"], key=lambda o: -o["worst_share"])]
pick = [got["k"]] + ([6] if 6 in slot["servers"] else [])
pick += [k for k in ranked if k not in pick]
print("worst-band shares:", {o["max_k"]: round(o["worst_share"], 3) for o in got["options"]},
      file=sys.stderr)
print(",".join(str(k) for k in pick[: int(sys.argv[3])]))
EOF
)
  fi
  echo "repeat: K=$ks (budget $RB s)"
  [ -n "$ks" ] && REALSIZE_KINDS=qwen35-27b REALSIZE_KS="$ks" \
    REALSIZE_ARGS="${REPEAT_ARGS:---levels 0.8 --concurrency 1,4,16,64 --min-requests 8 --per-k-estimate 90}" \
    REALSIZE_BUDGET_S="$RB" OUT="$OUT/repeat" bash .gpu-carry/realsize.sh
  # at most 8 files come back from $OUT: the repeat's env.txt is the sweep's (same machine)
  [ -f "$OUT/env.txt" ] && cmp -s "$OUT/env.txt" "$OUT/repeat/env.txt" && rm -f "$OUT/repeat/env.txt"
fi
echo "plain_call: $(( $(date +%s) - T0 )) s"
