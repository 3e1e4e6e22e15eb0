#!/usr/bin/env bash
# Builds the LeaderWorkerSet controller (kubernetes-sigs/lws) from the Go module proxy, once
# per machine, beside the control plane (hack/build-control-plane.sh).
#
# Why from source: as for the control plane, this machine reaches only package registries.
# The release's own go.mod and go.sum pin every dependency, so the module is built in a
# copy of itself (`go install pkg@version` would first ask the proxy for the version list,
# which it refuses for sigs.k8s.io/lws).  Next to the binary land the release's CRDs and
# webhook manifest, which `dsv4ctl cluster up` installs: one version for all three.
set -euo pipefail

LWS_VERSION="${LWS_VERSION:-v0.9.0}"
CACHE_DIR="${DSV4_CACHE_DIR:-$HOME/.cache/dsv4-operator}"
BIN_DIR="$CACHE_DIR/bin/lws-$LWS_VERSION"
WORK_DIR="$CACHE_DIR/build"
FILES=(lws-controller crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml
  crds/disaggregatedset.x-k8s.io_disaggregatedsets.yaml webhook-manifests.yaml)

source "$(dirname "$0")/go-build-env.sh"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

link_current() { ln -sfn "$BIN_DIR" "$CACHE_DIR/bin/lws-current"; }
complete=1
for f in "${FILES[@]}"; do
  [[ -s "$BIN_DIR/$f" ]] || complete=0
done
if ((complete)); then
  link_current
  echo "lws: cached in $BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "lws: 'go' is not on PATH; install Go >= 1.26" >&2; exit 1; }
mkdir -p "$BIN_DIR/crds" "$WORK_DIR"
start=$(date +%s)
log="$WORK_DIR/lws-$LWS_VERSION.log"
fail() { echo "lws: FAILED $1 after $(( $(date +%s) - start ))s; Go said:" >&2; tail -n 40 "$log" >&2; exit 1; }

echo "lws: downloading sigs.k8s.io/lws@$LWS_VERSION ..."
module_dir=$(go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" 2>"$log" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p') || true
[[ -n "$module_dir" && -d "$module_dir" ]] || fail "downloading"
src="$WORK_DIR/lws-$LWS_VERSION"
rm -rf "$src"
cp -r "$module_dir" "$src"
chmod -R u+w "$src"

echo "lws: building the controller (a cold build takes minutes on 2 cores) ..."
ldflags="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION"
(cd "$src" && go build -ldflags "$ldflags" -o "$BIN_DIR/lws-controller.tmp" ./cmd) >>"$log" 2>&1 || fail "building"
mv "$BIN_DIR/lws-controller.tmp" "$BIN_DIR/lws-controller"
cp "$src"/config/crd/bases/*.yaml "$BIN_DIR/crds/"
cp "$src/config/webhook/manifests.yaml" "$BIN_DIR/webhook-manifests.yaml"
rm -rf "$src"

link_current
echo "lws: ready in $BIN_DIR ($(( $(date +%s) - start ))s)"
