#!/usr/bin/env bash
# Installs the engine runtime (torch + Triton, then SGLang 0.5.23 without its GPU-only
# dependencies and the pure-Python packages it imports, then sglang-router with its own
# dependencies) into the Python given.
#
# Usage: requirements/install-runtime.sh PYTHON [PIP OPTION...]
#
# Why a script: the sequence (SGLang with --no-deps, then sglang-deps.txt) is what lets SGLang
# import on a CPU machine; the project venv (hack/venv.sh) and the CPU engine image
# (images/engine/cpu-base.Dockerfile) both need it, so it lives here once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="$1"
shift
pip=("$python" -m pip install --disable-pip-version-check "$@")
log() { echo "install-runtime: $*" >&2; }

log "installing torch + triton"
"${pip[@]}" -r "$here/runtime.txt"
log "installing sglang without its GPU dependencies"
"${pip[@]}" --no-deps -r "$here/sglang.txt"
"${pip[@]}" -r "$here/sglang-deps.txt"
log "installing sglang-router with its dependencies"
"${pip[@]}" -r "$here/router.txt"
