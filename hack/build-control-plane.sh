#!/usr/bin/env bash
# Builds the local Kubernetes control plane from the Go module proxy, once per machine.
#
# Why a script and not a download: this machine reaches only package registries, so
# kube-apiserver, kube-controller-manager, kube-scheduler, etcd and KWOK are compiled
# from their Go modules, at the versions hack/go-tools/go.mod pins.  The binaries land in a
# versioned cache outside the checkout ($DSV4_CACHE_DIR/bin/<versions>-<digest>/); a second
# run finds them and exits at once.
#
# One `go build` compiles all six: they share most of their packages, and the pinned module
# lets them share the same versions of those (see its go.mod), so each shared package compiles
# once.  With empty Go caches on 2 cores, the six and the LWS controller after them took 251 s
# and 489 CPU-s; built from four modules of their own, 401 s and 762 CPU-s.
set -euo pipefail

source "$(dirname "$0")/go-build-env.sh"
K8S_VERSION="$(go_tools_version k8s.io/kubernetes)"
CACHE_DIR="${DSV4_CACHE_DIR:-$HOME/.cache/dsv4-operator}"
BIN_DIR="$CACHE_DIR/bin/${K8S_VERSION}-etcd$(go_tools_version go.etcd.io/etcd/server/v3)-kwok$(go_tools_version sigs.k8s.io/kwok)-$GO_TOOLS_DIGEST"
WORK_DIR="$CACHE_DIR/build"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok kwokctl)
# The packages `go build` names the binaries after (etcd's is "server", renamed below).
PACKAGES=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
  k8s.io/kubernetes/cmd/kube-scheduler go.etcd.io/etcd/server/v3 sigs.k8s.io/kwok/cmd/kwok
  sigs.k8s.io/kwok/cmd/kwokctl)

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

link_current() { ln -sfn "$BIN_DIR" "$CACHE_DIR/bin/current"; }
if [[ -d "$BIN_DIR" ]]; then
  link_current
  echo "control plane: cached in $BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "control plane: 'go' is not on PATH; install Go >= 1.26" >&2; exit 1; }
mkdir -p "$WORK_DIR"
start=$(date +%s)
log="$WORK_DIR/control-plane.log"
echo "control plane: building ${COMPONENTS[*]} (a cold build takes minutes on 2 cores) ..."
# Built into a folder beside the cache's, renamed when all are there: the cache never holds
# part of a control plane.
rm -rf "$BIN_DIR.tmp"
mkdir -p "$BIN_DIR.tmp"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
if ! go -C "$GO_TOOLS" build -ldflags "$ldflags" -o "$BIN_DIR.tmp/" "${PACKAGES[@]}" >"$log" 2>&1; then
  echo "control plane: FAILED after $(( $(date +%s) - start ))s; Go said:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
mv "$BIN_DIR.tmp/server" "$BIN_DIR.tmp/etcd"
for c in "${COMPONENTS[@]}"; do
  [[ -x "$BIN_DIR.tmp/$c" ]] || { echo "control plane: go build made no $c" >&2; exit 1; }
done
mv "$BIN_DIR.tmp" "$BIN_DIR"

link_current
echo "control plane: ready in $BIN_DIR ($(( $(date +%s) - start ))s)"
