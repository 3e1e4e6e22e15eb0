#!/usr/bin/env bash
# Builds the project's images with podman: the operator image as shipped, the CPU variant
# of the engine image (the engine Dockerfile on images/engine/cpu-base.Dockerfile) and its
# production-equivalent variant (the engine Dockerfile on images/engine/sglang-base.Dockerfile:
# SGLang's full GPU stack; tens of minutes cold, so only when asked for).
#
# Usage: hack/images.sh [operator|engine-cpu|engine-sglang]...    (default: operator engine-cpu)
# Prints the name of each image it built, one a line; progress goes to stderr.
#
# Why a script: these machines run no Docker daemon and reach no container registry, so the
# upstream bases cannot be pulled.  mmdebstrap builds a Debian bookworm root filesystem
# (Python 3.11, as the venv's) from Debian's mirror and `podman import` makes it the base.
# The tarball is cached outside the checkout, keyed by its recipe
# ($DSV4_CACHE_DIR/images/base-<hash>.tar); podman's own layer cache makes a rebuild of
# unchanged sources take seconds; the pip cache of the machine is mounted into the build of
# the heavy layer (torch and its CUDA wheels), so they are downloaded once per machine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
CACHE_DIR="${DSV4_CACHE_DIR:-$HOME/.cache/dsv4-operator}"
IMAGES_DIR="$CACHE_DIR/images"
PIP_CACHE="${PIP_CACHE_DIR:-$HOME/.cache/pip}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
export CONTAINERS_CONF="$root/hack/containers.conf"

OPERATOR_IMAGE=localhost/dsv4-operator:dev
ENGINE_CPU_BASE=localhost/dsv4-engine-cpu-base:dev
ENGINE_CPU_IMAGE=localhost/dsv4-engine:cpu
ENGINE_SGLANG_BASE=localhost/dsv4-engine-sglang-base:dev
ENGINE_SGLANG_IMAGE=localhost/dsv4-engine:sglang
# What the Dockerfiles expect of a base: `python` (3.11) with venv, groupadd/useradd, and
# the CA certificates pip verifies PyPI with.  Documentation is left out, licences kept.
BASE_RECIPE=(
  bookworm
  --variant=minbase
  --include=python3,python3-venv,python-is-python3,ca-certificates,passwd
  --dpkgopt=path-exclude=/usr/share/doc/*
  --dpkgopt=path-include=/usr/share/doc/*/copyright
  --dpkgopt=path-exclude=/usr/share/man/*
  --dpkgopt=path-exclude=/usr/share/locale/*
  --dpkgopt=path-exclude=/usr/share/info/*
)

log() { echo "images: $*" >&2; }
start=$(date +%s)
elapsed() { echo "$(($(date +%s) - start))s"; }

"$root/hack/system-deps.sh"
mkdir -p "$IMAGES_DIR" "$PIP_CACHE"
# One builder of the base, and of each image, at a time: concurrent callers (two pytest
# workers, several shells) wait for the image they build, not behind another (the
# production-equivalent engine takes tens of minutes cold).
exec 9>"$IMAGES_DIR/.lock"
flock 9

base_image() { # sets BASE to the local bookworm base, made (or imported from the cache) first
  local key tar tag
  key=$(printf '%s\n' "${BASE_RECIPE[@]}" | sha256sum | cut -c1-12)
  tar="$IMAGES_DIR/base-$key.tar"
  tag="localhost/dsv4-base:bookworm-$key"
  if ! podman image exists "$tag"; then
    if [[ ! -f "$tar" ]]; then
      log "building the bookworm base with mmdebstrap ($(elapsed))"
      nice -n 10 mmdebstrap --quiet --format=tar "${BASE_RECIPE[@]}" "$tar.partial" \
        "$DEBIAN_MIRROR" >&2
      mv "$tar.partial" "$tar"
      # Keep this base and the one before it.
      ls -1t "$IMAGES_DIR"/base-*.tar | tail -n +3 | xargs -r rm -f
    fi
    log "importing $tar as $tag ($(elapsed))"
    podman import --quiet "$tar" "$tag" >/dev/null
  fi
  BASE="$tag"
}

build() { # build DOCKERFILE TAG [PODMAN BUILD OPTION...]
  local dockerfile="$1" tag="$2"
  shift 2
  log "building $tag from $dockerfile ($(elapsed))"
  local out="$IMAGES_DIR/build-${tag//[\/:]/_}.log" previous
  previous=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  # This machine's CA bundle, as the base's own: PyPI may be reached through a TLS proxy.
  if ! nice -n 10 podman build -f "$root/$dockerfile" -t "$tag" \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    "$@" "$root" >"$out" 2>&1; then
    log "FAILED building $tag; podman said:"
    tail -n 40 "$out" >&2
    exit 1
  fi
  # The engine base is GBs: drop the build this one replaced (kept if still in use).
  if [[ -n "$previous" && "$previous" != "$(podman image inspect --format '{{.Id}}' "$tag")" ]]; then
    podman rmi "$previous" >/dev/null 2>&1 || true
  fi
}

targets=("$@")
((${#targets[@]})) || targets=(operator engine-cpu)
base_image
flock -u 9
for target in "${targets[@]}"; do
  exec 9>"$IMAGES_DIR/.lock-$target"
  flock 9
  case "$target" in
    operator)
      build images/operator/Dockerfile "$OPERATOR_IMAGE" --build-arg "BASE=$BASE"
      echo "$OPERATOR_IMAGE"
      ;;
    engine-cpu)
      build images/engine/cpu-base.Dockerfile "$ENGINE_CPU_BASE" --build-arg "BASE=$BASE" \
        -v "$PIP_CACHE:/root/.cache/pip" --build-arg PIP_CACHE_OPTION=--cache-dir=/root/.cache/pip
      build images/engine/Dockerfile "$ENGINE_CPU_IMAGE" --build-arg "BASE=$ENGINE_CPU_BASE"
      echo "$ENGINE_CPU_IMAGE"
      ;;
    engine-sglang)
      build images/engine/sglang-base.Dockerfile "$ENGINE_SGLANG_BASE" --build-arg "BASE=$BASE" \
        -v "$PIP_CACHE:/root/.cache/pip" --build-arg PIP_CACHE_OPTION=--cache-dir=/root/.cache/pip
      build images/engine/Dockerfile "$ENGINE_SGLANG_IMAGE" --build-arg "BASE=$ENGINE_SGLANG_BASE"
      echo "$ENGINE_SGLANG_IMAGE"
      ;;
    *)
      log "unknown image '$target' (operator, engine-cpu, engine-sglang)"
      exit 2
      ;;
  esac
done
log "done in $(elapsed)"
