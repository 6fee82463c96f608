#!/usr/bin/env bash
# Builds the sandbox's binaries from Go modules and caches them outside the clone, keyed by
# version: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet
# (k8s.io/kubernetes), etcd, kwok, helm, the CNI plugins (bridge, host-local, loopback) and the
# LeaderWorkerSet controller (sigs.k8s.io/lws). A warm run only checks the cache and returns in well under a second.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
# the InferencePool CRD (traffic classes, issue 39): config/crd/bases of this module version
GAIE_VERSION="${GAIE_VERSION:-v1.6.2}"
# the LeaderWorkerSet controller (multi-node pools, issue 38): its manager binary (cmd/) and,
# from the same module, its CRD and webhook configurations (config/crd/bases, config/webhook)
LWS_VERSION="${LWS_VERSION:-v0.7.0}"
# the CNI plugins the real nodes' containerd runs for pods off hostNetwork: a bridge per node,
# host-local addresses and the pod's loopback (tests/sandbox/realnode.py)
CNI_VERSION="${CNI_VERSION:-v1.10.0}"
CNI_PLUGINS=(bridge host-local loopback)
# bumped when a binary's build flags change, so a warm cache from older flags is rebuilt
HELM_BUILD="${HELM_VERSION}-kv"
CACHE="${MTP_SANDBOX_CACHE:-$HOME/.cache/mtp-operator/sandbox}"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

# Progress lines go to the caller's stderr (fd 3); the Go tool's own output (hundreds of
# "go: downloading ..." lines on a cold build) goes to a log file per build, shown on failure.
exec 3>&2
log() { printf '[sandbox-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&3; }

# The cache directory for the Kubernetes binaries keeps its historical name
# kube-apiserver-<version> although it holds kube-apiserver, kube-controller-manager,
# kube-scheduler and kubectl.
KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
# kubelet (the sandbox's one real node, tests/sandbox/realnode.py) has its own cache directory
# kubelet-<version>, so adding it did not invalidate caches of the others.

complete() {  # complete DIR FILE...: every FILE is an executable (or a directory) in DIR
  local dir=$1 f; shift
  for f in "$@"; do [[ -x "$dir/$f" ]] || return 1; done
}

# build_cached NAME VERSION FUNC FILE...: runs FUNC TMPDIR VERSION unless CACHE/bin/NAME-VERSION
# already holds every FILE; the result is moved into place only when FUNC succeeded.
build_cached() {
  local name=$1 version=$2 fn=$3 out="$CACHE/bin/$1-$2"; shift 3
  local files=("$@")
  if complete "$out" "$@"; then return 0; fi
  command -v go >/dev/null || { log "ERROR: go not found on PATH (Go >= 1.26 needed)"; exit 1; }
  local tmp; tmp=$(mktemp -d "$CACHE/tmp.XXXXXX")
  TMPDIRS+=("$tmp")
  local start=$SECONDS
  mkdir -p "$CACHE/logs"; BUILD_LOG="$CACHE/logs/$name-$version.log"; : >"$BUILD_LOG"
  log "building $name $version (cold build; this takes minutes; Go output: $BUILD_LOG)"
  # a heartbeat, since compiling kube-apiserver prints nothing for minutes
  ( exec 9>&-; while sleep 30; do log "  ... still building $name ($((SECONDS - start)) s)"; done ) &
  BEAT=$! BUILDING="$name $version"
  # not in an `if`: errexit must stay in force inside the function
  "$fn" "$tmp" "$version" "${files[@]}" >>"$BUILD_LOG" 2>&1
  kill "$BEAT" 2>/dev/null; wait "$BEAT" 2>/dev/null || true
  BEAT="" BUILDING=""
  chmod 755 "$tmp" && rm -rf "$out" && mkdir -p "$(dirname "$out")" && mv "$tmp" "$out"
  log "built $name $version in $((SECONDS - start)) s -> $out"
}

# build_kube OUT VERSION CMD...: the wrapper module replaces every staging module
# k8s.io/kubernetes pins at v0.0.0
build_kube() {
  local out=$1 version=$2 mod; mod=$(mktemp -d); shift 2
  local cmds=("$@")
  local staging="v0.${version#v1.}"
  local kmod; kmod=$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module mtp-operator.io/sandbox/kube"; echo; echo "go 1.26.0"; echo
    echo "require k8s.io/kubernetes $version"; echo
    echo "tool ("
    for c in "${cmds[@]}"; do echo "	k8s.io/kubernetes/cmd/$c"; done
    echo ")"; echo; echo "replace ("
    grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$kmod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > "$mod/go.mod"
  local major=${version#v}; major=${major%%.*}; local minor=${version#v*.}; minor=${minor%%.*}
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$mod" && log "resolving k8s.io/kubernetes $version modules" && go mod tidy >&2)
  for c in "${cmds[@]}"; do
    log "  compiling $c"
    (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$out/$c" "k8s.io/kubernetes/cmd/$c")
  done
  rm -rf "$mod"
}

build_etcd() {  # etcd's main package is the root of go.etcd.io/etcd/server/v3
  local out=$1 version=$2 mod; mod=$(mktemp -d)
  printf 'module mtp-operator.io/sandbox/etcd\n\ngo 1.26.0\n\ntool go.etcd.io/etcd/server/v3\n' > "$mod/go.mod"
  (cd "$mod" && go get "go.etcd.io/etcd/server/v3@$version" >&2 && go mod tidy >&2 &&
     go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$mod"
}

build_kwok() {
  local out=$1 version=$2
  GOBIN="$out" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$version" "sigs.k8s.io/kwok/cmd/kwok@$version"
  # kwok's standalone binary has no default stages; keep the ones the module ships beside it.
  local src; src=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$version/kustomize/stage
  mkdir -p "$out/stages" && cp -r "$src"/. "$out/stages/" && chmod -R u+w "$out/stages"
}

# Like Helm's own Makefile: the Kubernetes version a client-only `helm template` assumes
# (.Capabilities.KubeVersion, checked against a chart's kubeVersion) is client-go's minor + 1.x
# from Helm's go.mod (client-go v0.37.0 -> v1.37.0), set by ldflags; without them it is v1.20.
build_helm() {  # $2 is the cache key HELM_BUILD; the module version is HELM_VERSION
  local out=$1 version=$HELM_VERSION mod; mod=$(mktemp -d)
  local major=${version#v}; major=${major%%.*}
  local pkg="helm.sh/helm/v$major"
  printf 'module mtp-operator.io/sandbox/helm\n\ngo 1.26.0\n\ntool %s/cmd/helm\n' "$pkg" > "$mod/go.mod"
  (cd "$mod" && go get "$pkg@$version" >&2 && go mod tidy >&2)
  local cg; cg=$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/client-go)  # v0.37.0
  cg=${cg#v}; local kmajor=$(( ${cg%%.*} + 1 )) kminor=${cg#*.}; kminor=${kminor%%.*}
  local ld="-s -w -X $pkg/internal/version.version=$version -X $pkg/internal/version.metadata="
  ld+=" -X $pkg/internal/version.gitTreeState=clean"
  for p in "$pkg/pkg/lint/rules" "$pkg/pkg/chartutil"; do
    ld+=" -X $p.k8sVersionMajor=$kmajor -X $p.k8sVersionMinor=$kminor"
  done
  (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$out/helm" "$pkg/cmd/helm")
  rm -rf "$mod"
}

build_cni() {
  local out=$1 version=$2 m=github.com/containernetworking/plugins/plugins
  GOBIN="$out" go install -trimpath -ldflags "-s -w" "$m/main/bridge@$version" \
    "$m/ipam/host-local@$version" "$m/main/loopback@$version"
}

# The Gateway API Inference Extension's InferencePool CRD, copied from the Go module (nothing
# to compile): the cluster tests apply it and check the operator's InferencePool against it.
build_gaie() {
  local out=$1 version=$2 mod; mod=$(mktemp -d)
  local dir; dir=$(cd "$mod" && go mod init mtp-operator.io/sandbox/gaie >&2 &&
    go mod download -json "sigs.k8s.io/gateway-api-inference-extension@$version" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$out/crds"
  cp "$dir/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$out/crds/"
  chmod -R u+w "$out/crds"
  rm -rf "$mod"
}

# sigs.k8s.io/lws: the manager (cmd/main.go) built under its own go.mod's requirements, its
# CRD and its webhook manifests (with the patch that limits the pod webhooks to LWS pods)
build_lws() {
  local out=$1 version=$2 mod; mod=$(mktemp -d)
  printf 'module mtp-operator.io/sandbox/lws\n\ngo 1.26.0\n\ntool sigs.k8s.io/lws/cmd\n' > "$mod/go.mod"
  (cd "$mod" && go get "sigs.k8s.io/lws@$version" >&2 && go mod tidy >&2 &&
     go build -trimpath -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$version" \
       -o "$out/lws-manager" sigs.k8s.io/lws/cmd)
  local dir; dir=$(cd "$mod" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)
  mkdir -p "$out/crds" "$out/webhook"
  cp "$dir/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$out/crds/"
  cp "$dir/config/webhook/manifests.yaml" "$dir/config/webhook/mutating-patch.yaml" \
     "$dir/config/webhook/validating-patch.yaml" "$out/webhook/"
  chmod -R u+w "$out/crds" "$out/webhook"
  rm -rf "$mod"
}

mkdir -p "$CACHE/bin"
TMPDIRS=() BEAT="" BUILDING="" BUILD_LOG=""
on_exit() {
  local rc=$?
  if [[ -n $BEAT ]]; then kill "$BEAT" 2>/dev/null || true; fi
  if ((${#TMPDIRS[@]})); then rm -rf "${TMPDIRS[@]}"; fi
  if [[ $rc -ne 0 && -n $BUILDING ]]; then
    log "ERROR: building $BUILDING failed (exit $rc); the end of $BUILD_LOG:"
    tail -n 40 "$BUILD_LOG" >&3 || true
  fi
}
trap on_exit EXIT
# one build at a time per cache (two checkouts or CI jobs may share it); a warm run that finds
# everything in place does not wait for the lock
all_cached() {
  complete "$CACHE/bin/etcd-$ETCD_VERSION" etcd &&
    complete "$CACHE/bin/kwok-$KWOK_VERSION" kwok stages &&
    complete "$CACHE/bin/helm-$HELM_BUILD" helm &&
    complete "$CACHE/bin/kube-apiserver-$KUBE_VERSION" "${KUBE_BINS[@]}" &&
    complete "$CACHE/bin/kubelet-$KUBE_VERSION" kubelet &&
    complete "$CACHE/bin/cni-$CNI_VERSION" "${CNI_PLUGINS[@]}" &&
    complete "$CACHE/bin/gaie-$GAIE_VERSION" crds &&
    complete "$CACHE/bin/lws-$LWS_VERSION" lws-manager crds webhook
}
if ! all_cached; then
  exec 9>"$CACHE/build.lock"
  if ! flock -n 9; then log "another build holds $CACHE/build.lock; waiting"; flock 9; fi
fi
total=$SECONDS
build_cached etcd "$ETCD_VERSION" build_etcd etcd
build_cached kwok "$KWOK_VERSION" build_kwok kwok stages
build_cached helm "$HELM_BUILD" build_helm helm
build_cached kube-apiserver "$KUBE_VERSION" build_kube "${KUBE_BINS[@]}"
build_cached kubelet "$KUBE_VERSION" build_kube kubelet
build_cached cni "$CNI_VERSION" build_cni "${CNI_PLUGINS[@]}"
build_cached gaie "$GAIE_VERSION" build_gaie crds
build_cached lws "$LWS_VERSION" build_lws lws-manager crds webhook
# one directory of links, so callers need a single PATH entry
mkdir -p "$CACHE/current"
ln -sfn "$CACHE/bin/etcd-$ETCD_VERSION/etcd" "$CACHE/current/etcd"
ln -sfn "$CACHE/bin/kwok-$KWOK_VERSION/kwok" "$CACHE/current/kwok"
ln -sfn "$CACHE/bin/kwok-$KWOK_VERSION/stages" "$CACHE/current/kwok-stages"
ln -sfn "$CACHE/bin/helm-$HELM_BUILD/helm" "$CACHE/current/helm"
for c in "${KUBE_BINS[@]}"; do
  ln -sfn "$CACHE/bin/kube-apiserver-$KUBE_VERSION/$c" "$CACHE/current/$c"
done
ln -sfn "$CACHE/bin/kubelet-$KUBE_VERSION/kubelet" "$CACHE/current/kubelet"
ln -sfn "$CACHE/bin/cni-$CNI_VERSION" "$CACHE/current/cni"
ln -sfn "$CACHE/bin/gaie-$GAIE_VERSION/crds" "$CACHE/current/gaie-crds"
ln -sfn "$CACHE/bin/lws-$LWS_VERSION" "$CACHE/current/lws"
if (( SECONDS - total > 1 )); then log "all sandbox binaries ready in $((SECONDS - total)) s"; fi
echo "$CACHE/current"
