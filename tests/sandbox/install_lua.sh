#!/usr/bin/env bash
# Installs the stand-alone Lua 5.4 interpreter from Debian when `lua5.4` is missing, so the
# Argo CD health-check tests (tests/unit/deploy/test_argocd_health.py) also run under real Lua 5.4,
# not only under the embedded one (lupa). Idempotent: returns at once when it is present.
set -euo pipefail

if command -v lua5.4 >/dev/null 2>&1; then
  exit 0
fi
SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo -n); fi
export DEBIAN_FRONTEND=noninteractive
echo "[install-lua] apt-get install lua5.4" >&2
"${SUDO[@]}" apt-get update -qq >&2
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends lua5.4 >&2
lua5.4 -v >&2
