#!/usr/bin/env bash
# Installs what the image builds and the sandbox's real node need, from Debian, when missing:
# podman + buildah (build and run images), runc, debootstrap (the local Debian base),
# containerd (the real node's container runtime). Idempotent: returns at once when all are
# present. No service is started (policy-rc.d); containerd runs as a plain process with its
# own config (tests/sandbox/realnode.py).
set -euo pipefail

TOOLS=(podman buildah runc debootstrap containerd ctr)
missing=()
for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null || missing+=("$t"); done
((${#missing[@]})) || exit 0
SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo -n); fi
export DEBIAN_FRONTEND=noninteractive
echo "[install-tools] apt-get install podman buildah runc debootstrap containerd (missing: ${missing[*]})" >&2
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
  "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
  trap '"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
fi
"${SUDO[@]}" apt-get update -qq >&2
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends podman buildah runc debootstrap \
  containerd >&2
for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null || { echo "[install-tools] $t still missing" >&2; exit 1; }; done
