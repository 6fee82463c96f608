#!/usr/bin/env bash
# Assemble the folder the GPU machine gets (default .gpu-carry/ of this checkout, gitignored):
#
#   bash bench/gpu/prepare_carry.sh [DEST]
#
# It holds the vLLM bundle (built by build_bundle.py if DEST has none), the stdlib installer,
# measure.sh/measure.py, a copy of runtime/mtp_runtime and of the tiny-model scripts
# tests/engine/{tiny_model,tiny_mimo,traffic}.py (ENGINE_REF=<git ref> takes them from another
# branch instead of the work tree).
# Then, on the GPU machine: bash .gpu-carry/measure.sh
set -eu
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DEST="${1:-$ROOT/.gpu-carry}"
mkdir -p "$DEST/engine" "$DEST/runtime"
if [ ! -s "$DEST/vllm-bundle.tar.xz" ]; then
  python3 "$ROOT/bench/gpu/build_bundle.py" --out "$DEST"
fi
cp "$ROOT/bench/gpu/install_bundle.py" "$ROOT/bench/gpu/measure.py" "$ROOT/bench/gpu/measure.sh" \
   "$ROOT/bench/gpu/realsize.py" "$ROOT/bench/gpu/realsize.sh" "$ROOT/bench/gpu/realsize_models.py" \
   "$ROOT/bench/gpu/acceptance_ext.py" "$DEST/"
rm -rf "$DEST/runtime/mtp_runtime"
cp -r "$ROOT/runtime/mtp_runtime" "$DEST/runtime/"
find "$DEST/runtime" -name __pycache__ -prune -exec rm -rf {} +
for f in tiny_model.py tiny_mimo.py traffic.py; do
  if [ -n "${ENGINE_REF:-}" ]; then
    git -C "$ROOT" show "$ENGINE_REF:tests/engine/$f" > "$DEST/engine/$f"
  else
    cp "$ROOT/tests/engine/$f" "$DEST/engine/$f"
  fi
done
du -sh "$DEST"
du -sb "$DEST" | awk '{ if ($1 > 62 * 1048576) { print "over the transfer limit"; exit 1 } }'
