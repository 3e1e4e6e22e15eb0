# syntax=docker/dockerfile:1
# The CPU stand-in for SGLang's image, on which `make images` builds the engine image's CPU
# variant (images/engine/Dockerfile with BASE set to this): what that Dockerfile expects of
# its base -- Python with torch, Triton and SGLang 0.5.23 as `python3` on PATH, groupadd and
# useradd -- made from a Debian bookworm base (hack/images.sh) and the project's pins.
#
# torch is PyPI's wheel (the only one reachable here), which runs on CPU; SGLang is
# installed without its GPU-only dependencies, exactly as the project venv does it
# (requirements/install-runtime.sh), so the engine image's version assertion, plugin check
# and gate check all run in the CPU variant's build.
ARG BASE
FROM ${BASE}

# hack/images.sh mounts the machine's pip cache and names it here, so torch and its CUDA
# wheels (GBs) are not downloaded again when a pin changes (where PyPI's responses can be
# cached: a proxy that strips their Cache-Control headers defeats it); a plain build keeps
# no cache in the layer.
ARG PIP_CACHE_OPTION=--no-cache-dir
# Only what the heavy layer depends on, so a change elsewhere in requirements/ keeps it cached.
COPY requirements/install-runtime.sh requirements/runtime.txt requirements/sglang.txt \
     requirements/sglang-deps.txt requirements/router.txt /src/requirements/
RUN python -m venv /opt/engine \
 && /src/requirements/install-runtime.sh /opt/engine/bin/python -q "$PIP_CACHE_OPTION" \
 && rm -rf /src
ENV PATH=/opt/engine/bin:$PATH
