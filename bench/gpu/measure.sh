#!/usr/bin/env bash
# The whole H200 measurement in one command, run on the GPU machine from the repository root:
#
#   bash .gpu-carry/measure.sh [sweep|smoke]        (results under $OUT)
#
# .gpu-carry/ is what bench/gpu/prepare_carry.sh assembles: the vLLM bundle and its installer,
# a copy of the runtime package, the tiny-model and traffic scripts, measure.py and this file.
# Steps: record the machine; install the bundle (no network); train the tiny MTP model on the
# GPU with the project's own script; `mtp-runtime detect`; then measure.py (mtp-runtime serve
# + real vLLM per K, both traffic classes, each concurrency). Every step is time-boxed and
# writes as it goes, so a failure still returns what was measured before it.
set -u
C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODE="${1:-sweep}"
OUT="${OUT:-/tmp/mtp-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/measure.log") 2>&1
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
PY=python3

stamp "machine"
{
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,count,driver_version,compute_cap --format=csv,noheader)"
  nvidia-smi | sed -n 3p
  echo "python: $($PY -c 'import sys; print(sys.version.split()[0], sys.executable)')"
  $PY -c "import torch; print('torch:', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  $PY -c "import transformers, numpy, numba; print('transformers:', transformers.__version__, 'numpy:', numpy.__version__, 'numba:', numba.__version__)"
  echo "cpus: $(nproc)"
} 2>&1 | tee "$OUT/env.txt"

stamp "install bundle"
SITE=/tmp/vllm-site
timeout 180 $PY "$C/install_bundle.py" "$C/vllm-bundle.tar.xz" $(ls "$C"/extra-*.tar.xz 2>/dev/null) --target "$SITE" || { echo "install failed"; exit 1; }
cp "$SITE/bundle-install.json" "$OUT/install.json"
export PYTHONPATH="$SITE:$C/runtime:$C/engine"
export PATH="$SITE/bin:$PATH"
export MTP_RUNTIME_VLLM="$SITE/bin/vllm"
# vLLM 0.26 on this machine: no flashinfer (sampler), the V1 model runner, nothing from a hub
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_USE_V2_MODEL_RUNNER=0 HF_HUB_OFFLINE=1
# FlashAttention is not in the bundle: the drafter needs the Triton backend too (vLLM picks the
# drafter's backend by itself unless the speculative config names one)
export MTP_RUNTIME_DRAFT_ATTENTION_BACKEND=TRITON_ATTN
export TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
$PY -c "import numpy, numba, vllm; print('vllm:', vllm.__version__, 'numpy:', numpy.__version__, 'numba:', numba.__version__)" | tee -a "$OUT/env.txt"

# fail fast, with the module's name, if the bundle lacks something `vllm serve` imports
timeout 180 $PY -c "import vllm.entrypoints.openai.api_server, vllm.v1.spec_decode.eagle, vllm.model_executor.models.mimo_mtp; print('vllm serve imports: ok')" 2>&1 | tail -25

stamp "tiny model (tests/engine/tiny_model.py --device cuda)"
MODEL_LINE=$(timeout 240 $PY "$C/engine/tiny_model.py" --device cuda --out /tmp/tiny-model | tail -1)
echo "$MODEL_LINE"
MODEL="${MODEL_LINE#MODEL=}"
[ -f "$MODEL/config.json" ] || { echo "no model"; exit 1; }
head -c 1500 "$MODEL/config.json"; echo

stamp "mtp-runtime detect"
$PY -m mtp_runtime.cli detect | tee "$OUT/detect.json"

if [ "$MODE" = smoke ]; then
  stamp "smoke: K=1, eager"
  timeout 200 $PY "$C/measure.py" --model "$MODEL" --out "$OUT" --ks 1 --budget-s 170 \
    --work /tmp/mtp-measure-eager
  stamp "smoke: K=1, full CUDA graphs for decode, no torch.compile"
  timeout 200 $PY "$C/measure.py" --model "$MODEL" --out "$OUT/graphs" --ks 1 --budget-s 170 \
    --concurrency 1,64 --work /tmp/mtp-measure-graphs \
    --extra "--attention-backend TRITON_ATTN --gpu-memory-utilization 0.25 --max-num-seqs 64 --seed 0 --compilation-config {\"mode\":0,\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}"
else
  LEFT=$(( ${SWEEP_BUDGET_S:-560} - ($(date +%s) - T0) ))
  stamp "sweep K=0..6 x concurrency 1,8,64 x both classes (budget ${LEFT} s)"
  # K=1 and K=4 (the fixtures) and the planned K first, so a time-out costs the others
  timeout $(( LEFT + 30 )) $PY "$C/measure.py" --model "$MODEL" --out "$OUT" --planned-k \
    --ks "${SWEEP_KS:-1,4,6,0,2,3,5}" --min-requests 4 --budget-s "$LEFT" ${MEASURE_ARGS:-}
fi
stamp "done"
