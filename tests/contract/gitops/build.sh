#!/usr/bin/env bash
# Builds the GitOps check programs (argocd-health: gopher-lua as Argo CD runs health scripts;
# kstatus: Flux's status library) from the Go module proxy and caches them outside the clone,
# keyed by their sources, go.mod/go.sum and the Go version. Last output line: the bin directory.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
command -v go >/dev/null || { echo "gitops build: go not found on PATH (Go >= 1.26)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
KEY=$( (cd "$HERE" && cat go.mod go.sum ./*/main.go && go env GOVERSION) | sha256sum | cut -c1-16)
CACHE="${MTP_GITOPS_CACHE:-$HOME/.cache/mtp-operator/gitops}"
OUT="$CACHE/$KEY"
if [[ ! -x $OUT/argocd-health || ! -x $OUT/kstatus ]]; then
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "gitops build: go build argocd-health kstatus (cold: ~1-2 min)" >&2
  (cd "$HERE" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/" ./argocd-health ./kstatus)
  chmod 755 "$tmp"
  rm -rf "$OUT" && mv "$tmp" "$OUT"
fi
echo "$OUT"
