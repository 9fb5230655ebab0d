# The README's two commands: `make dev` and `make test`. Both set up everything they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)

HOST ?= 127.0.0.1
MODEL_PORT ?= 8080
PORT ?= 8000

.PHONY: help setup browser dev dev-fleet dev-docker dev-gpu images k8s-render test lint typecheck bench \
	test-quick redis bench-model bench-demo bench-load bench-quality bench-timings bench-blends bench-speech bench-batch bench-faults bench-frameworks bench-fleet soak gpu-check deploy-sagemaker lock clean

help:
	@echo "make dev          model server ($(HOST):$(MODEL_PORT)) and gateway (http://$(HOST):$(PORT))"
	@echo "make dev-fleet    Redis, two gateways sharing it (PORT, PORT+1), one model server"
	@echo "make test         lint, type-check and run the test suite"
	@echo "make test-quick   the edit loop: the suite without the real engine, slow tests or the browser"
	@echo "make bench        gateway: time to first audio, bidi vs batch"
	@echo "make bench-model  model-server latency/RTF table"
	@echo "make bench-demo   the demo page in Chromium: first audio heard after Speak, quiet and busy"
	@echo "make bench-load   conversations at once: first audio, gaps, refusals (two policies)"
	@echo "make bench-quality  MOS and word error rate by voice, format, chunk plan, joins"
	@echo "make bench-timings  word timings against where the waveform's energy puts them"
	@echo "make bench-blends   voice blends streamed against their one call, beside their voices"
	@echo "make bench-speech   pauses, a pronunciation, Japanese vs English first audio, markup's cost"
	@echo "make bench-batch    the model server with --batch off and on: concurrent streams side by side"
	@echo "make bench-faults   a model server killed and restarted, frozen alone and in a pair"
	@echo "make bench-frameworks  first audio and word timestamps: pipecat, LiveKit plugins vs the WebSocket"
	@echo "                   BENCH_ARGS=\"--scenario both\" (or barge-in): and barge-in to the next turn, plugins at c2154e7 vs now"
	@echo "make bench-fleet  two gateways sharing Redis vs alone: refusals, gaps, caps, round trips"
	@echo "make soak         conversations for DURATION (30m): memory, descriptors, tasks, threads, errors"
	@echo "make gpu-check    on a GPU box: bench-load, bench-model, torch engine tests on CUDA"
	@echo "make dev-docker   the same stack in containers, CPU (docker compose)"
	@echo "make dev-gpu      containers on a GPU box: KOKORO_MODEL_DIR=/path/to/Kokoro-82M"
	@echo "make images       build the model server (gpu, cpu) and gateway (+ AgentCore, arm64) images"
	@echo "make k8s-render   print the Kubernetes manifests: OVERLAY=cpu|gpu"
	@echo "make lock         re-resolve uv.lock after changing pyproject.toml"

# The virtual environment, rebuilt whenever the lock file or the project metadata changes.
$(VENV)/.synced: uv.lock pyproject.toml
	@if ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then \
		py=$$(scripts/find-python) && rm -rf $(VENV) && $$py -m venv $(VENV); fi
	@$(PY) -m pip install --quiet --disable-pip-version-check "uv==0.13.8"
	@$(UV) sync --frozen --extra torch --python $(PY)
	@touch $@

setup: $(VENV)/.synced

# Debian's Chromium for the browser tests (Playwright's own browser download cannot work here).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; }

# Debian's redis-server for the fleet's tests (each starts its own on a loopback port; the
# package's own service is not needed, and on a machine without systemd it is not started).
redis:
	@command -v redis-server >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server; }

dev: setup
	$(PY) scripts/dev.py --host $(HOST) --model-port $(MODEL_PORT) --port $(PORT) \
		--model-args "$(MODEL_ARGS)" $(DEV_ARGS)

# Redis and two gateways sharing it (ports PORT and PORT+1) in front of one model server
dev-fleet: setup redis
	$(PY) scripts/dev.py --fleet --host $(HOST) --model-port $(MODEL_PORT) --port $(PORT) \
		--model-args "$(MODEL_ARGS)" $(DEV_ARGS)

# Containers (need a Docker engine with compose; dev-gpu also the NVIDIA Container Toolkit).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
COMPOSE := docker compose -f docker/compose.yaml
OVERLAY ?= cpu

dev-docker:
	$(COMPOSE) up --build

dev-gpu:
	@test -n "$(KOKORO_MODEL_DIR)" || { \
		echo "make dev-gpu KOKORO_MODEL_DIR=/path/to/Kokoro-82M (config.json, kokoro-v1_0.pth, voices/)"; \
		exit 2; }
	KOKORO_MODEL_DIR=$(abspath $(KOKORO_MODEL_DIR)) $(COMPOSE) -f docker/compose.gpu.yaml up --build

images:
	docker build -f docker/model-server-gpu.Dockerfile -t kokoro-model-server:gpu-$(VERSION) .
	docker build -f docker/model-server-cpu.Dockerfile -t kokoro-model-server:cpu-$(VERSION) .
	docker build -f docker/gateway.Dockerfile -t kokoro-gateway:$(VERSION) .
	docker build --platform linux/arm64 -f docker/gateway-agentcore.Dockerfile \
		-t kokoro-gateway-agentcore:$(VERSION) .

k8s-render: setup
	@$(VENV)/bin/kubectl kustomize k8s/overlays/$(OVERLAY)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

# The suite on two workers (pytest-xdist): much of it waits on servers, processes and timeouts,
# so two share the cores. `--dist loadscope` runs each file whole on one worker, its module
# fixtures made once (docs/testing.md: why not loadgroup's groups).
test: lint typecheck browser redis
	$(VENV)/bin/pytest -n 2 --dist loadscope $(PYTEST_ARGS)

# The edit loop: no real Kokoro engine, no slow test, no browser (all three run in `make test`);
# stops at the first failure.
test-quick: setup redis
	$(VENV)/bin/pytest -m "not real_model and not slow" --ignore=tests/end_to_end/test_browser.py \
		-x -q $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench.bench_gateway $(BENCH_ARGS)

bench-model: setup
	$(PY) -m bench.bench_model $(BENCH_ARGS)

bench-demo: setup browser
	$(PY) -m bench.bench_demo $(BENCH_ARGS)

bench-load: setup
	$(PY) -m bench.bench_load $(BENCH_ARGS)

bench-quality: setup
	$(PY) -m bench.bench_quality $(BENCH_ARGS)

bench-timings: setup
	$(PY) -m bench.bench_timings $(BENCH_ARGS)

bench-blends: setup
	$(PY) -m bench.bench_blends $(BENCH_ARGS)

bench-batch: setup
	$(PY) -m bench.bench_batch $(BENCH_ARGS)

bench-speech: setup
	$(PY) -m bench.bench_speech $(BENCH_ARGS)

bench-faults: setup
	$(PY) -m bench.bench_faults $(BENCH_ARGS)

bench-frameworks: setup
	$(PY) -m bench.bench_frameworks $(BENCH_ARGS)

bench-fleet: setup redis
	$(PY) -m bench.bench_fleet $(BENCH_ARGS)

# make soak DURATION=90s CONVERSATIONS=2 (default: 30m, as many as the model server holds)
DURATION ?= 30m
CONVERSATIONS ?= auto
soak: setup
	$(PY) -m bench.soak --duration $(DURATION) --conversations $(CONVERSATIONS) $(BENCH_ARGS)

# On a machine with an NVIDIA GPU: KOKORO_MODEL_DIR=/path/to/Kokoro-82M (or =random) make gpu-check
gpu-check: setup
	scripts/gpu-check

# make deploy-sagemaker DEPLOY_ARGS="--name kokoro-tts --image-uri URI --role-arn ARN --model-data s3://..."
deploy-sagemaker: setup
	$(VENV)/bin/kokoro-deploy sagemaker $(DEPLOY_ARGS)

lock: setup
	$(UV) lock

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
