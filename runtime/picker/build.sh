#!/usr/bin/env bash
# Builds the class-aware endpoint picker (cmd/mtp-picker) and the ext-proc probe
# (cmd/extproc-probe) once per state of this module: the binaries go to
# ~/.cache/mtp-operator/picker-<hash> (hash of the Go version, go.mod, go.sum and the non-test
# sources), so a second call returns at once. Last line on stdout: PICKER_DIR=<that folder>.
# Progress on stderr; the Go tool's output in <folder>.log. Locked against concurrent builds.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${MTP_CACHE_DIR:-$HOME/.cache/mtp-operator}
command -v go >/dev/null || { echo "build.sh: no go on PATH (Go 1.25 or later is needed)" >&2; exit 1; }
hash=$(cd "$here" && { go version; cat go.mod go.sum;
  find . -name '*.go' ! -name '*_test.go' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } \
  | sha256sum | cut -c1-16)
out=$cache/picker-$hash
built() { [[ -x $out/mtp-picker && -x $out/extproc-probe ]]; }
if ! built; then
  mkdir -p "$cache"
  exec 9>"$cache/picker.lock"
  flock 9
  if ! built; then
    echo "build.sh: building the picker and the probe into $out (cold: minutes on 2 cores)" >&2
    tmp=$(mktemp -d "$cache/picker-build.XXXXXX")
    t0=$(date +%s)
    if ! (cd "$here" && nice -n 10 go build -o "$tmp/" ./cmd/mtp-picker ./cmd/extproc-probe) \
        >"$out.log" 2>&1; then
      tail -n 30 "$out.log" >&2
      rm -rf "$tmp"
      echo "build.sh: go build failed (log: $out.log)" >&2
      exit 1
    fi
    rm -rf "$out"
    mv "$tmp" "$out"
    echo "build.sh: built in $(( $(date +%s) - t0 )) s" >&2
  fi
fi
echo "PICKER_DIR=$out"
