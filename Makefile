# Two commands for a newcomer: `make run` (the main job) and `make test` (the whole suite).
# Both build .venv from requirements.lock first when it is missing or out of date.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test venv clean

run: venv
	$(BIN)/bert-multi demo

test: venv
	$(BIN)/python -m pytest

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
