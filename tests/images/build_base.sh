#!/usr/bin/env bash
# Makes the local Debian base image the image builds start from where no base can be pulled:
# `debootstrap` (Debian's packages, reachable like apt) -> a root file system -> `podman import`.
#
#   tests/images/build_base.sh            # last output line: BASE=localhost/mtp-debian-base:<key>
#
# The tarball is cached in ~/.cache/mtp-operator/images/ keyed by this script's hash (suite and
# package list live here), so a warm run only re-imports it when podman's store lacks the tag.
# In a real release the Dockerfile's default bases (public images) are used instead.
set -euo pipefail

SUITE=bookworm
MIRROR="${MTP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# python3 (3.11) + venv for both images; libgomp1/libnuma1 for the CPU engine's kernels
PACKAGES=python3,python3-venv,ca-certificates,libgomp1,libnuma1
CACHE="${MTP_IMAGES_CACHE:-$HOME/.cache/mtp-operator/images}"
HERE=$(cd "$(dirname "$0")" && pwd)
KEY=$(sha256sum "$HERE/build_base.sh" | cut -c1-12)
TAG="localhost/mtp-debian-base:$SUITE-$KEY"
TARBALL="$CACHE/debian-base-$SUITE-$KEY.tar"

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
for tool in debootstrap podman; do
  command -v "$tool" >/dev/null || { log "ERROR: $tool not found (tests/images/install_tools.sh)"; exit 1; }
done
mkdir -p "$CACHE"
exec 8>"$CACHE/base.lock"
flock 8
if [[ ! -s $TARBALL ]]; then
  start=$SECONDS
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$root" "$TARBALL.tmp"' EXIT
  log "debootstrap $SUITE ($PACKAGES) from $MIRROR (cold: ~2 min)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >&2
  # a smaller, reproducible-enough tree: no apt lists, caches, docs or logs
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
         "$root"/usr/share/man/* "$root"/var/log/*
  tar --numeric-owner -C "$root" -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
  log "base root file system $(du -m "$TARBALL" | cut -f1) MB in $((SECONDS - start)) s -> $TARBALL"
fi
if ! podman image exists "$TAG"; then
  podman import --change 'CMD ["/bin/bash"]' "$TARBALL" "$TAG" >/dev/null
  log "imported $TAG"
fi
echo "BASE=$TAG"
