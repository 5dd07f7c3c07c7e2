# Entry points (see README): `make explore` opens the explorer (JupyterLab on
# notebooks/explore.ipynb, 127.0.0.1, with a token; it prints the URL), `make plan` runs the
# command-line planner, `make test` lints and runs every test (what CI runs), `make test-fast`
# lints and runs the tests not marked slow, stopping at the first failure (for development).
# Each sets up a local virtual environment from pyproject.toml first, so they work from a
# fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8

.PHONY: setup explore plan test test-fast lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[ui,test,bench]'
	touch $@

setup: $(VENV)/.installed

explore: setup
	$(PY) -m explorer.ui.lab $(EXPLORE_ARGS)

plan: setup
	$(PY) -m explorer plan --model gpt --preset tiny --mesh 4

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: lint
	$(PY) -m pytest

# `slow` marks the longest tests: notebook, browser and benchmark runs, multi-process
# clusters, whole-model checks
test-fast: lint
	$(PY) -m pytest -x -q -m "not slow"

bench: setup
	$(PY) benchmarks/trace_bench.py
	$(PY) benchmarks/profile_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
