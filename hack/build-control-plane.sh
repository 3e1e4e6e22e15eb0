#!/usr/bin/env bash
# Builds the local Kubernetes control plane from the Go module proxy, once per machine.
#
# Why a script and not a download: this machine reaches only package registries, so
# kube-apiserver, kube-controller-manager, kube-scheduler, etcd and KWOK are compiled
# from their Go modules.  The binaries land in a versioned cache outside the checkout
# ($DSV4_CACHE_DIR/bin/<k8s>-<etcd>-<kwok>/); a second run finds them and exits at once.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CACHE_DIR="${DSV4_CACHE_DIR:-$HOME/.cache/dsv4-operator}"
BIN_DIR="$CACHE_DIR/bin/${K8S_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}"
WORK_DIR="$CACHE_DIR/build"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok kwokctl)

source "$(dirname "$0")/go-build-env.sh"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

missing=()
for c in "${COMPONENTS[@]}"; do
  [[ -x "$BIN_DIR/$c" ]] || missing+=("$c")
done
link_current() { ln -sfn "$BIN_DIR" "$CACHE_DIR/bin/current"; }
if [[ ${#missing[@]} -eq 0 ]]; then
  link_current
  echo "control plane: cached in $BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "control plane: 'go' is not on PATH; install Go >= 1.26" >&2; exit 1; }
mkdir -p "$BIN_DIR" "$WORK_DIR"
start=$(date +%s)

step() { # step NAME COMMAND... — runs one build step, showing progress and Go's error on failure
  local name="$1"; shift
  local t0; t0=$(date +%s)
  echo "control plane: building $name (elapsed $(( t0 - start ))s) ..."
  local log="$WORK_DIR/$name.log"
  if ! "$@" >"$log" 2>&1; then
    echo "control plane: FAILED building $name after $(( $(date +%s) - t0 ))s; Go said:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  echo "control plane: built $name in $(( $(date +%s) - t0 ))s"
}

# --- Kubernetes: a wrapper module that pins every staging module to its published v0.Y.Z.
k8s_mod="$WORK_DIR/kubernetes-$K8S_VERSION"
staging_version="v0.${K8S_VERSION#v1.}"
write_k8s_module() {
  mkdir -p "$k8s_mod"
  local gomod; gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module dsv4.dev/controlplane"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod"
    echo ")"
  } >"$k8s_mod/go.mod"
  cat >"$k8s_mod/tools.go" <<'GO'
//go:build tools

package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  (cd "$k8s_mod" && go mod tidy -e)
}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
need() { [[ ! -x "$BIN_DIR/$1" ]]; }
if need kube-apiserver || need kube-controller-manager || need kube-scheduler; then
  step kubernetes-module write_k8s_module
fi
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  if need "$c"; then
    step "$c" bash -c "cd '$k8s_mod' && go build -tags tools -ldflags '$ldflags' -o '$BIN_DIR/$c' k8s.io/kubernetes/cmd/$c"
  fi
done

# --- etcd
if need etcd; then
  etcd_mod="$WORK_DIR/etcd-$ETCD_VERSION"
  write_etcd_module() {
    mkdir -p "$etcd_mod"
    printf 'module dsv4.dev/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$etcd_mod/go.mod"
    printf '//go:build tools\n\npackage etcd\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$etcd_mod/tools.go"
    (cd "$etcd_mod" && go mod tidy -e)
  }
  step etcd-module write_etcd_module
  step etcd bash -c "cd '$etcd_mod' && go build -tags tools -ldflags '-s -w' -o '$BIN_DIR/etcd' go.etcd.io/etcd/server/v3"
fi

# --- KWOK
for c in kwok kwokctl; do
  if need "$c"; then
    step "$c" env GOBIN="$BIN_DIR" go install -ldflags '-s -w' "sigs.k8s.io/kwok/cmd/$c@$KWOK_VERSION"
  fi
done

link_current
echo "control plane: ready in $BIN_DIR ($(( $(date +%s) - start ))s)"
