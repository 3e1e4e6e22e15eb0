# syntax=docker/dockerfile:1
# The production-equivalent stand-in for SGLang's image, on which `make images-sglang` builds
# the engine image `localhost/dsv4-engine:sglang` (images/engine/Dockerfile with BASE set to
# this): a Debian bookworm base (hack/images.sh) with SGLang 0.5.23 installed from the
# package index WITH its dependencies -- torch 2.14.1 (CUDA 13), sglang-kernel, FlashInfer,
# DeepGEMM, FlashMLA, DeepEP, CUTLASS DSL, TileLang -- as `pip install sglang==0.5.23`
# resolves them (requirements/install-runtime.sh --full, the CPU variant's recipe in its
# other mode).  It lacks what SGLang's image adds outside pip: a system CUDA toolkit (CUDA's
# libraries and nvcc come only as the wheels SGLang's stack pulls in), and NVIDIA's driver (a
# GPU node mounts it).
ARG BASE
FROM ${BASE}

# A C compiler and Python's headers: Triton builds its CUDA launcher with them the first
# time a kernel runs on a GPU.  libnuma1: CUDA's cuFile
# (GPUDirect Storage; torch links it) loads it by name, not as a link-time dependency.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc g++ libc6-dev python3-dev libnuma1 \
 && rm -rf /var/lib/apt/lists/*

# hack/images.sh mounts the machine's pip cache and names it here (as cpu-base.Dockerfile).
ARG PIP_CACHE_OPTION=--no-cache-dir
COPY requirements/install-runtime.sh requirements/runtime.txt requirements/sglang.txt \
     requirements/router.txt /src/requirements/
RUN python -m venv /opt/engine \
 && /src/requirements/install-runtime.sh --full /opt/engine/bin/python -q "$PIP_CACHE_OPTION" \
 && rm -rf /src
ENV PATH=/opt/engine/bin:$PATH
