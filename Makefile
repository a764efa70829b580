# Two commands set everything up on a fresh machine:
#   make quickstart   venv + install + train the quickstart on CPU
#   make test         venv + install + lint + the test suite
# PyTorch: the default pins a release (on a CPU-only machine use a CPU wheel, e.g.
# TORCH="torch --index-url https://download.pytorch.org/whl/cpu"); a torch already in
# the venv that satisfies torch>=2.4 is kept.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install quickstart test lint bench

$(BIN)/flexgraph: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install $(TORCH)
	$(BIN)/python -m pip install -e ".[test]"
	touch $@

install: $(BIN)/flexgraph

quickstart: install
	$(BIN)/flexgraph run examples/quickstart.py

lint: install
	$(BIN)/ruff check .

test: lint
	$(BIN)/pytest -n 2

bench: install
	$(BIN)/python benchmarks/plan_speed.py
	$(BIN)/python benchmarks/loop_overhead.py
	$(BIN)/python benchmarks/startup.py
