#!/bin/sh
# The engine image's checks, run from the image on a GPU node (docs/install.md), with this
# folder mounted at /bench:
#
#   docker run --rm --gpus all -v "$PWD/bench:/bench:ro" \
#     --entrypoint /bench/engine_image_checks.sh ENGINE_IMAGE
#
# First what the image's build ran without a GPU, again where the engine runs: the plugin
# loaded by SGLang's own load_plugins() with every hook applied, and the HiCache gate on
# SGLang's pool classes.  Then the one check that needs the GPU, gpu_kernels_check.py, with
# its time budget as a hard limit: its exit status is this script's (0 every check passed,
# 1 one failed, 2 no CUDA device was visible and nothing was checked, 124 out of time).
set -eu
python3 -m dsv4_engine.sglang_plugin.load_check
python3 -m dsv4_engine.sglang_plugin.gate_check
exec timeout 240 python3 "$(dirname "$0")/gpu_kernels_check.py"
