#!/usr/bin/env bash
# `make images`: builds the project's images from the Dockerfile with buildah, on a local Debian
# base (build_base.sh) since no base image can be pulled here.
#
#   tests/images/build.sh [operator] [runtime-cpu]     # default: both
#
# Last output lines: OPERATOR_IMAGE=<ref> and/or RUNTIME_CPU_IMAGE=<ref> (in podman's store).
# Each image is tagged with a key over its inputs (the Dockerfile, .dockerignore, every file
# the build context sends, this script, the base), so a warm run with unchanged inputs builds
# nothing; buildah's --layers cache also keeps the CPU engine's layer while only our package
# changes. The CPU runtime image starts from build_engine_base.sh's base (the engine venv of
# `make engine` copied in), so the Dockerfile's engine step reuses it instead of a second
# PyPI install; MTP_IMAGES_ENGINE=pypi builds it the release way. The GPU target `runtime`
# (FROM vllm/vllm-openai) is not built: its base cannot be pulled here
# (tests/unit/deploy/test_dockerfile.py checks it statically).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
targets=("$@")
((${#targets[@]})) || targets=(operator runtime-cpu)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)

base_line=$(bash tests/images/build_base.sh | tail -1)
BASE=${base_line#BASE=}

# the build context as buildah sends it: .dockerignore's re-included paths, minus its excludes
context_files() {
  { printf '%s\n' Dockerfile .dockerignore tests/images/build.sh pyproject.toml README.md
    find operator runtime -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' \
      ! -path 'runtime/picker/*'
    if [[ $1 == runtime-cpu ]]; then echo tests/engine/install_engine.sh; echo tests/images/build_engine_base.sh; fi
  } | LC_ALL=C sort
}
key_of() {  # key_of TARGET BASE
  { echo "$2"; echo "$1"; context_files "$1" | while read -r f; do echo "$f"; sha256sum < "$f"; done
  } | sha256sum | cut -c1-12
}

# runc + cgroupfs + rlimits below the hard limits + the host network: what works on these
# machines (crun refuses cgroup v1 hybrid; the default bridge uses a private 10.x range).
BUILD=(buildah bud --runtime runc --cgroup-manager cgroupfs --network host --layers
       --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --build-arg "PYTHON_IMAGE=$BASE")
# RUN steps trust what the host trusts (e.g. a TLS-inspecting proxy's CA in front of PyPI): the
# host's CA bundle is mounted for the build only; it is not part of any image layer.
CA=${MTP_BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
if [[ -s $CA ]]; then BUILD+=(--volume "$CA:/etc/ssl/certs/ca-certificates.crt:ro"); fi
results=()
for target in "${targets[@]}"; do
  case $target in
    operator) base=$BASE; tag="localhost/mtp-operator:$VERSION-$(key_of operator "$base")"
      var=OPERATOR_IMAGE ;;
    runtime-cpu)
      [[ -f tests/engine/install_engine.sh ]] || { log "ERROR: tests/engine/install_engine.sh missing"; exit 1; }
      # the Debian base plus this machine's engine venv (make engine), or BASE for PyPI
      base_line=$(bash tests/images/build_engine_base.sh "$BASE" | tail -1)
      base=${base_line#CPU_BASE=}
      tag="localhost/mtp-runtime:$VERSION-cpu-$(key_of runtime-cpu "$base")"; var=RUNTIME_CPU_IMAGE ;;
    runtime) log "ERROR: the GPU runtime target builds FROM vllm/vllm-openai, which cannot be pulled here"; exit 1 ;;
    *) log "ERROR: unknown target $target (operator, runtime-cpu)"; exit 1 ;;
  esac
  if podman image exists "$tag"; then
    log "$target: $tag (inputs unchanged; cached)"
  else
    start=$SECONDS
    log "$target: building $tag"
    "${BUILD[@]}" --build-arg "CPU_BASE=$base" --target "$target" -t "$tag" . >&2
    log "$target: built in $((SECONDS - start)) s"
    # superseded builds of this target (same repository and tag prefix) only take disk
    repo=${tag%%:*} tagname=${tag#*:}
    podman images --format '{{.Repository}}:{{.Tag}}' "$repo" | while read -r old; do
      if [[ $old != "$tag" && ${old#*:} == "${tagname%-*}-"* ]]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
    done
  fi
  size=$(podman image inspect --format '{{.Size}}' "$tag")
  log "$target: $tag $((size / 1000000)) MB"
  results+=("$var=$tag")
done
printf '%s\n' "${results[@]}"
