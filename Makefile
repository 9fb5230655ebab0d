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

.PHONY: help setup browser dev test lint typecheck bench bench-model deploy-sagemaker lock clean

help:
	@echo "make dev          model server ($(HOST):$(MODEL_PORT)) and gateway (http://$(HOST):$(PORT))"
	@echo "make test         lint, type-check and run the test suite"
	@echo "make bench        gateway: time to first audio, bidi vs batch"
	@echo "make bench-model  model-server latency/RTF table"
	@echo "make lock         re-resolve uv.lock after changing pyproject.toml"

# The virtual environment, rebuilt whenever the lock file or the project metadata changes.
$(VENV)/.synced: uv.lock pyproject.toml
	@if ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then \
		py=$$(scripts/find-python) && rm -rf $(VENV) && $$py -m venv $(VENV); fi
	@$(PY) -m pip install --quiet --disable-pip-version-check "uv==0.13.8"
	$(UV) sync --frozen --python $(PY)
	@touch $@

setup: $(VENV)/.synced

# Debian's Chromium for the browser tests (Playwright's own browser download cannot work here).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; }

dev: setup
	$(PY) scripts/dev.py --host $(HOST) --model-port $(MODEL_PORT) --port $(PORT) $(DEV_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

test: lint typecheck browser
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench.bench_gateway $(BENCH_ARGS)

bench-model: setup
	$(PY) -m bench.bench_model $(BENCH_ARGS)

# make deploy-sagemaker DEPLOY_ARGS="--name kokoro-tts --image-uri URI --role-arn ARN --model-data s3://..."
deploy-sagemaker: setup
	$(VENV)/bin/kokoro-deploy sagemaker $(DEPLOY_ARGS)

lock: setup
	$(UV) lock

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
