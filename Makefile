# shoal: `make test` sets up everything (venv, packages, system tools) and runs every gate.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test check sysdeps lint types pytest clean run

$(PY):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,torch]'
	touch $(STAMP)

sysdeps:
	@bash .ci/sysdeps.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check config wal health sync node tests bench
	$(VENV)/bin/ruff format --check config wal health sync node tests bench

types: $(STAMP)
	$(VENV)/bin/mypy

check: lint types

pytest: $(STAMP)
	$(VENV)/bin/pytest

test: sysdeps check pytest

# Start one node with embedded defaults: SQLite and state in ./.shoal, API on 127.0.0.1:8770.
run: $(STAMP)
	@echo "shoal: starting a node; API at http://127.0.0.1:$${SHOAL_P2P_PORT:-8770} (Ctrl-C stops it)"
	$(VENV)/bin/shoal serve --data-dir .shoal

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
