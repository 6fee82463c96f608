#!/usr/bin/env bash
# The real-size sweep in one command on the GPU machine, from the repository root:
#
#   REALSIZE_KINDS=qwen35-27b REALSIZE_KS=0,1,2 bash .gpu-carry/realsize.sh     (results in $OUT)
#
# Installs the carried vLLM bundle (once per machine: a warm machine keeps /tmp/vllm-site),
# records the machine, then runs realsize.py per model kind inside one time box
# (REALSIZE_BUDGET_S, default 540 s for the whole call). Everything is written as it goes.
set -u
C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp/mtp-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/realsize.log") 2>&1
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
PY=python3
BUDGET="${REALSIZE_BUDGET_S:-540}"

stamp "machine"
{
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,count,driver_version,compute_cap --format=csv,noheader)"
  $PY -c 'import sys; print("python:", sys.version.split()[0])'
  $PY -c "import torch; print('torch:', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  echo "cpus: $(nproc)"
} 2>&1 | tee "$OUT/env.txt"

SITE=/tmp/vllm-site
if [ ! -f "$SITE/bundle-install.json" ]; then
  stamp "install bundle"
  timeout 180 $PY "$C/install_bundle.py" "$C/vllm-bundle.tar.xz" $(ls "$C"/extra-*.tar.xz 2>/dev/null) --target "$SITE" >/tmp/install.log 2>&1 || { tail -30 /tmp/install.log; echo "install failed"; exit 1; }
else
  stamp "bundle already installed (warm machine)"
fi
export PYTHONPATH="$SITE:$C/runtime:$C/engine:$C"
export PATH="$SITE/bin:$PATH"
export MTP_RUNTIME_VLLM="$SITE/bin/vllm"
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_USE_V2_MODEL_RUNNER=0 HF_HUB_OFFLINE=1
export MTP_RUNTIME_DRAFT_ATTENTION_BACKEND=TRITON_ATTN
export TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# Triton keeps compiled kernels in ~/.triton; with this it keeps autotuning results too, so
# only the first engine start on a machine pays for both (the first 27B start spent ~100 s)
export TRITON_CACHE_AUTOTUNING=1
$PY -c "import vllm; print('vllm:', vllm.__version__)" | tee -a "$OUT/env.txt"
export MTP_BENCH_PRODUCT="$($PY -m mtp_runtime.cli detect 2>/dev/null | $PY -c 'import json,sys; print(json.load(sys.stdin).get("product",""))' 2>/dev/null)"
echo "product: $MTP_BENCH_PRODUCT" | tee -a "$OUT/env.txt"

for kind in ${REALSIZE_KINDS:-qwen35-27b}; do
  LEFT=$(( BUDGET - ($(date +%s) - T0) ))
  [ "$LEFT" -gt 90 ] || { stamp "no time left for $kind"; continue; }
  stamp "$kind: K=${REALSIZE_KS:-0,1,2,3,4,5,6} (budget ${LEFT} s)"
  timeout $(( LEFT + 20 )) $PY "$C/realsize.py" --kind "$kind" --out "$OUT" \
    --ks "${REALSIZE_KS:-0,1,2,3,4,5,6}" --budget-s "$LEFT" ${REALSIZE_ARGS:-}
done
stamp "done"
