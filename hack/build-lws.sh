#!/usr/bin/env bash
# Builds the LeaderWorkerSet controller (kubernetes-sigs/lws) from the Go module proxy, once
# per machine, beside the control plane (hack/build-control-plane.sh).
#
# Why from source: as for the control plane, this machine reaches only package registries.
# It builds in the module that pins the control plane (hack/go-tools/go.mod), so the
# Kubernetes libraries both use compile once: after the control plane, 7-9 s on a cold
# machine (70 s from a module of its own).  Next to the binary land the release's CRDs and
# webhook manifest, from the same module download, which `dsv4ctl cluster up` installs: one
# version for all three.
set -euo pipefail

source "$(dirname "$0")/go-build-env.sh"
LWS_VERSION="$(go_tools_version sigs.k8s.io/lws)"
CACHE_DIR="${DSV4_CACHE_DIR:-$HOME/.cache/dsv4-operator}"
BIN_DIR="$CACHE_DIR/bin/lws-$LWS_VERSION-$GO_TOOLS_DIGEST"
WORK_DIR="$CACHE_DIR/build"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

link_current() { ln -sfn "$BIN_DIR" "$CACHE_DIR/bin/lws-current"; }
if [[ -d "$BIN_DIR" ]]; then
  link_current
  echo "lws: cached in $BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "lws: 'go' is not on PATH; install Go >= 1.26" >&2; exit 1; }
mkdir -p "$WORK_DIR"
start=$(date +%s)
log="$WORK_DIR/lws.log"
fail() { echo "lws: FAILED $1 after $(( $(date +%s) - start ))s; Go said:" >&2; tail -n 40 "$log" >&2; exit 1; }

echo "lws: building the controller $LWS_VERSION (a cold build takes minutes on 2 cores) ..."
# Built into a folder beside the cache's, renamed when complete (as the control plane).
rm -rf "$BIN_DIR.tmp"
mkdir -p "$BIN_DIR.tmp/crds"
ldflags="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION"
go -C "$GO_TOOLS" build -ldflags "$ldflags" -o "$BIN_DIR.tmp/lws-controller" sigs.k8s.io/lws/cmd \
  >"$log" 2>&1 || fail "building"
module_dir="$(go -C "$GO_TOOLS" list -m -f '{{.Dir}}' sigs.k8s.io/lws 2>>"$log")" || fail "finding its module"
cp "$module_dir"/config/crd/bases/*.yaml "$BIN_DIR.tmp/crds/"
cp "$module_dir/config/webhook/manifests.yaml" "$BIN_DIR.tmp/webhook-manifests.yaml"
chmod -R u+w "$BIN_DIR.tmp"
mv "$BIN_DIR.tmp" "$BIN_DIR"

link_current
echo "lws: ready in $BIN_DIR ($(( $(date +%s) - start ))s)"
