# Two commands for a newcomer: `make run` (the main job) and `make test` (the whole suite).
# Both build their environments from the lock files first when missing or out of date.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# NumPy 2 with PyTorch and JAX, no MXNet: JAX lives there, and the core and the torch backend must work
# there too. Each environment runs the other's frameworks in a worker process (bert_multi.backend.remote).
VENV_NUMPY2 := .venv-numpy2
# The documentation site's builder, pinned in requirements-docs.lock.
VENV_DOCS := .venv-docs

.PHONY: run test packages bytecode check docs test-main test-numpy2 fuzz gpu kernels venv clean

run: packages venv $(VENV_NUMPY2)/.installed bytecode
	$(BIN)/bert-multi conform
run: PACKAGES := $(VENV)/.packages $(VENV_NUMPY2)/.packages

# The checks (one core, mostly mypy) beside the site (the guide's samples), then the tests: both
# environments' whatever the first's outcome, and then which failed.
test: packages venv $(VENV_NUMPY2)/.installed $(VENV_DOCS)/.installed bytecode
	@$(MAKE) --no-print-directory -j2 check docs
	@failed=""; \
	$(MAKE) --no-print-directory test-main || failed="$$failed $(VENV)"; \
	$(MAKE) --no-print-directory test-numpy2 || failed="$$failed $(VENV_NUMPY2)"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED in$$failed (the FAILED lines above say which tests)"; exit 1; fi; \
	echo "make test: every test passed, in $(VENV) and in $(VENV_NUMPY2)"

# The environments' packages from their lock files (all three, or those a target names), installed side
# by side (pip spends much of its time writing files): on the reference VM the three take 70 s so,
# against 97 s one after the other. This checkout then goes into each in turn as a target needs it
# (pip install -e writes its egg-info here).
PACKAGES := $(VENV)/.packages $(VENV_NUMPY2)/.packages $(VENV_DOCS)/.installed
packages:
	@$(MAKE) --no-print-directory -q $(PACKAGES) || $(MAKE) --no-print-directory -j3 $(PACKAGES)

# Where PYTHONDONTWRITEBYTECODE is set (as on the reference VM) Python writes no bytecode, and an editable
# install compiles none, so each process a run starts (the tests start hundreds: the command line,
# workers) would compile the modules it imports from this tree again: compiled once here instead. It
# saves a tenth of the CPU time of tests/test_hostile_worker.py.
bytecode: venv
	$(BIN)/python -m compileall -q bert_multi tests conformance conftest.py

# Lint, formatting and types, before any test: a red check fails the run at once.
check: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The site from docs/ into site/ (open site/index.html), warnings as errors. The guide's samples run
# first, each in its framework's environment, and their outputs go on its page.
docs: venv $(VENV_NUMPY2)/.installed $(VENV_DOCS)/.installed
	$(BIN)/python -m bert_multi.tools.site build/docs/guide.md
	$(VENV_DOCS)/bin/sphinx-build -q -E -W --keep-going -b html -d build/docs/doctrees docs site

# Under `make test` the site's tests fail, rather than skip, where the site is not built. Every process
# of the run (both environments' tests, their workers, the samples they run) shares one compilation
# cache, kept beside the build. Each environment's tests run in a process per core (at most 4; a file's
# tests in one of them, pytest-xdist's loadfile), and it prints its slowest tests, where the time goes.
TEST_CACHE := BERT_MULTI_CACHE_DIR=$(CURDIR)/build/compile-cache
PYTEST := -m pytest -n logical --maxprocesses 4 --dist loadfile --durations=12
test-main: venv $(VENV_NUMPY2)/.installed
	BERT_MULTI_SITE_REQUIRED=1 $(TEST_CACHE) $(BIN)/python $(PYTEST)

# PyTorch is in both environments: its own tests run in the first only, and so do those marked `once`,
# whose subject is the same in every environment (conftest.py's tested_elsewhere).
test-numpy2: venv $(VENV_NUMPY2)/.installed
	BERT_MULTI_SITE_REQUIRED=1 BERT_MULTI_TESTED_ELSEWHERE=torch=$(VENV),once=$(VENV) $(TEST_CACHE) $(VENV_NUMPY2)/bin/python $(PYTEST) -q -p no:cacheprovider

# A longer hunt for hostile files than the test suite's (4 s per reader, over its two environments):
# FUZZ_SECONDS per reader.
FUZZ_SECONDS ?= 300
fuzz: venv
	$(BIN)/python tests/hostile.py fuzz all --seconds $(FUZZ_SECONDS) --out fuzz-out

# A Jupyter kernel for each environment (bert_multi-mxnet-torch, bert_multi-jax-torch), in Jupyter's own
# kernels folder: the notebooks of `bert-multi lessons --notebooks DIR` name the one their framework needs.
kernels: venv $(VENV_NUMPY2)/.installed
	$(BIN)/bert-multi kernels

# On a GPU machine, with its own python3 (no environment built): pytest -m cuda and gpu-check in under 8
# minutes, into gpu-run/ (docs/gpu.md).
gpu:
	PYTHONPATH=. $(PYTHON) -m bert_multi.tools.gpu_run --out gpu-run

venv: $(VENV)/.installed

$(VENV)/.packages: requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	touch $@

$(VENV)/.installed: $(VENV)/.packages pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

$(VENV_NUMPY2)/.packages: requirements-numpy2.lock
	$(PYTHON) -m venv $(VENV_NUMPY2)
	$(VENV_NUMPY2)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-numpy2.lock
	touch $@

$(VENV_NUMPY2)/.installed: $(VENV_NUMPY2)/.packages pyproject.toml
	$(VENV_NUMPY2)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

$(VENV_DOCS)/.installed: requirements-docs.lock
	$(PYTHON) -m venv $(VENV_DOCS)
	$(VENV_DOCS)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-docs.lock
	touch $@

clean:
	rm -rf $(VENV) $(VENV_NUMPY2) $(VENV_DOCS) site build/docs build/compile-cache .pytest_cache .hypothesis *.egg-info fuzz-out gpu-run
	find bert_multi tests conformance -name __pycache__ -prune -exec rm -rf {} +
