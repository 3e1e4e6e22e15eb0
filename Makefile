# dsv4-operator — every target installs what it needs first (a cached venv and a cached
# control plane, both outside the checkout; see hack/).
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV = $(shell hack/venv.sh)
PY = $(VENV)/bin/python
export PATH := $(VENV)/bin:$(PATH)
# Write bytecode even where the environment says not to (this machine's sets
# PYTHONDONTWRITEBYTECODE=1): otherwise every Python process compiles the project's modules
# again as it imports them, and each pytest worker rewrites every test module's asserts again.
# `make test` starts hundreds of such processes (workers, operators, runtimes, probes).  The
# bytecode lands in __pycache__ beside the sources, which git and the image builds ignore.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: help venv control-plane kube-score images images-sglang test test-unit test-images test-images-sglang test-e2e lint demo cluster-up cluster-down manifests bench bench-engine bench-engine-server bench-validator bench-echo bench-scale bench-hicache-pressure bench-live-judge

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

venv: ## Create the cached project venv (pinned requirements/*.txt) and install the project
	@hack/venv.sh >/dev/null

system-deps: ## Install the Debian packages tests need (chromium ...), skipped when present
	@hack/system-deps.sh

control-plane: ## Build kube-apiserver, controller-manager, scheduler, etcd, KWOK and the LWS controller once per machine
	@hack/build-control-plane.sh
	@hack/build-lws.sh

kube-score: ## Build kube-score once per machine (tests score every rendered sample with it)
	@hack/build-kube-score.sh

images: ## Build the operator image and the CPU engine image with podman on a local Debian base (cached; hack/images.sh)
	@hack/images.sh

images-sglang: ## Build the production-equivalent engine image, localhost/dsv4-engine:sglang: SGLang 0.5.23 with its whole GPU stack (cached; cold: see docs/install.md)
	@hack/images.sh engine-sglang

# Four workers on two cores: the e2e groups (three, one control plane each) spend much of
# their time waiting on states, and a fourth worker keeps both cores busy with in-process
# tests meanwhile (1.92 of 2 cores busy on average, against 1.77 with three workers).
test: venv system-deps control-plane kube-score lint ## Run every test: unit, real SGLang, end-to-end on a real control plane
	$(PY) -m pytest tests -n 4 --dist loadgroup -m "not engine_image" --durations=25

test-unit: venv system-deps kube-score ## Unit tests only (no cluster, no image)
	$(PY) -m pytest tests -m "not e2e and not images"

test-images: venv control-plane ## Build the images (make images) and run them as their pods do, the CPU engine image included: alone, and serving a canary on the local cluster
	$(PY) -m pytest tests/images tests/e2e/test_engine_image.py -m "not sglang_image"

# The image first, outside pytest: its cold build (~16 min) outlasts a test's 600 s timeout.
test-images-sglang: venv images-sglang ## Build the production-equivalent engine image (make images-sglang) and run its checks: SGLang's GPU stack whole, each sample's engine.yaml accepted by SGLang, no GPU named, the router
	$(PY) -m pytest tests/images -m sglang_image

test-e2e: venv control-plane ## End-to-end tests only
	$(PY) -m pytest tests -m e2e

lint: venv ## ruff, over every Python file of the project
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: venv control-plane ## The incident's story on production defaults, ~2 min: garbled tool calls FAIL a canary, the gated engine PASSes (see README)
	$(PY) -m dsv4_dev.demo

cluster-up: venv control-plane ## Start the local cluster with fake Blackwell nodes and the local runtime (their engines answer)
	$(VENV)/bin/dsv4ctl cluster up --engines

cluster-down: venv ## Stop the local cluster and everything it started
	$(VENV)/bin/dsv4ctl cluster down

manifests: venv ## Regenerate crds/ from the typed API models (operator/dsv4_operator/api/), docs/api-reference.md from crds/, docs/rollout.md's rollout-class table and docs/known-issues.md's table
	$(PY) -m dsv4_operator.api.crd crds/dsv4deployment.yaml
	$(PY) hack/api_reference.py crds/dsv4deployment.yaml docs/api-reference.md
	$(PY) hack/rollout_classes.py docs/rollout.md
	$(PY) hack/known_issues.py docs/known-issues.md

bench: bench-plan bench-probe bench-echo bench-validator bench-engine-server bench-engine bench-rollout bench-scale bench-live-judge ## Run every benchmark (each bench-* target adds itself here)

bench-probe: venv ## Probe client throughput at concurrency 64, samples needed to PASS / FAIL
	$(PY) bench/bench_probe.py

bench-echo: venv ## Echo model under the injected race: rate per share, samples and seconds to FAIL at ~5/15/50%, seconds to PASS gated
	$(PY) bench/bench_echo_race.py

bench-rollout: venv control-plane ## On the shipped defaults: FAIL, PASS of another transfer format, PASS of the same format, undo: times to verdict and promotion, peak GPUs, samples, API writes
	$(PY) bench/bench_rollout.py

bench-scale: venv control-plane ## 500 DSV4Deployments on 1,000 fake GPU nodes: the cluster alone, then the operator (time to Ready and their ratio), passes, API requests, CPU, RSS, a 50-way flag change
	$(PY) bench/bench_scale.py

bench-validator: venv ## Validator per-class precision/recall on the combined DSML corpus and on a fresh held-out set (seed printed), and its speed
	$(PY) -m bench.bench_validator

bench-plan: venv ## Time `dsv4ctl plan` (must stay interactive: well under a second)
	$(PY) bench/bench_plan.py

bench-engine: venv ## Pools/HiCache: gate overhead, prefix load vs recompute, race rates, kernels
	$(PY) bench/bench_engine.py

bench-hicache-pressure: venv ## Reference engine under host-tier pressure: 50 seeded runs per HiCache write policy, every answer its own request's (~4 min)
	DSV4_HICACHE_PRESSURE_SEEDS=50 $(PY) -m pytest -q tests/unit/reference/test_hicache_pressure.py -k own_requests

bench-engine-server: venv ## Reference engine: req/s and tok/s at concurrency 1/16/64, HiCache on/off, warm!=cold rates
	$(PY) bench/bench_engine_server.py

bench-live-judge: venv ## Live judging of served tool calls off vs on in one run (reference engine, concurrency 64): CPU/request, p50/p99, the judge's own cost, validator throughput on long outputs
	$(PY) bench/bench_live_judge.py
