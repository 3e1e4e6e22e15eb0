#!/usr/bin/env bash
# Builds kube-score (github.com/zegl/kube-score) from the Go module proxy, once per machine,
# beside the control plane (hack/build-control-plane.sh).
#
# Why: issue 29 asks that every rendered sample be scored in `make test`; this machine
# reaches only package registries, so the binary is compiled from its module.  kube-score's
# go.mod has no replace directives, so `go install pkg@version` builds it with the
# release's own go.sum.  The binary lands in a versioned cache outside the checkout
# ($DSV4_CACHE_DIR/bin/kube-score-<version>/); a second run finds it and exits at once.
set -euo pipefail

KUBE_SCORE_VERSION="${KUBE_SCORE_VERSION:-v1.20.0}"
CACHE_DIR="${DSV4_CACHE_DIR:-$HOME/.cache/dsv4-operator}"
BIN_DIR="$CACHE_DIR/bin/kube-score-$KUBE_SCORE_VERSION"
WORK_DIR="$CACHE_DIR/build"

source "$(dirname "$0")/go-build-env.sh"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

link_current() { ln -sfn "$BIN_DIR" "$CACHE_DIR/bin/kube-score-current"; }
if [[ -x "$BIN_DIR/kube-score" ]]; then
  link_current
  echo "kube-score: cached in $BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "kube-score: 'go' is not on PATH; install Go >= 1.26" >&2; exit 1; }
mkdir -p "$BIN_DIR" "$WORK_DIR"
start=$(date +%s)
log="$WORK_DIR/kube-score-$KUBE_SCORE_VERSION.log"
echo "kube-score: building github.com/zegl/kube-score@$KUBE_SCORE_VERSION (a cold build takes minutes on 2 cores) ..."
if ! GOBIN="$BIN_DIR.tmp" go install -ldflags "-s -w -X main.version=$KUBE_SCORE_VERSION" \
  "github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION" >"$log" 2>&1; then
  echo "kube-score: FAILED after $(( $(date +%s) - start ))s; Go said:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
mv "$BIN_DIR.tmp/kube-score" "$BIN_DIR/kube-score"
rmdir "$BIN_DIR.tmp"

link_current
echo "kube-score: ready in $BIN_DIR ($(( $(date +%s) - start ))s)"
