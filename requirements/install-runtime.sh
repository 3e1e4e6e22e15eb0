#!/usr/bin/env bash
# Installs the engine runtime into the Python given, in one of two modes:
#
# - CPU (default): torch + Triton, then SGLang 0.5.23 without its GPU-only dependencies and
#   the pure-Python packages it imports (sglang-deps.txt), then sglang-router with its own
#   dependencies.  What lets SGLang import on a CPU machine.
# - --full: torch, SGLang 0.5.23 and sglang-router in one resolve WITH every dependency, as
#   `pip install sglang==0.5.23` resolves them: SGLang's GPU stack (sglang-kernel,
#   FlashInfer, DeepGEMM, FlashMLA, DeepEP, CUTLASS DSL, TileLang, ...), what SGLang's own
#   image carries.  runtime.txt's pins are SGLang's own, so pip fails loudly if they part.
#
# Usage: requirements/install-runtime.sh [--full] PYTHON [PIP OPTION...]
#
# Why a script: the project venv (hack/venv.sh) and the CPU engine image
# (images/engine/cpu-base.Dockerfile) install the CPU mode, the production-equivalent engine
# image (images/engine/sglang-base.Dockerfile) the full one; the pins live here once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
full=false
if [[ "${1:-}" == --full ]]; then
  full=true
  shift
fi
python="$1"
shift
pip=("$python" -m pip install --disable-pip-version-check "$@")
log() { echo "install-runtime: $*" >&2; }

if "$full"; then
  log "installing torch, sglang and sglang-router with every dependency (SGLang's GPU stack)"
  "${pip[@]}" -r "$here/runtime.txt" -r "$here/sglang.txt" -r "$here/router.txt"
  exit 0
fi
log "installing torch + triton"
"${pip[@]}" -r "$here/runtime.txt"
log "installing sglang without its GPU dependencies"
"${pip[@]}" --no-deps -r "$here/sglang.txt"
"${pip[@]}" -r "$here/sglang-deps.txt"
log "installing sglang-router with its dependencies"
"${pip[@]}" -r "$here/router.txt"
