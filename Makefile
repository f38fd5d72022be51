# shoal: `make test` sets up everything (venv, packages, system tools) and runs every gate.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
RUN_STAMP := $(VENV)/.run-stamp
TEST_INSTALL := '.[test,torch,ray]'
RUN_INSTALL := '.'

.PHONY: test check sysdeps lint types pytest docs clean run

$(PY):
	python3 -m venv $(VENV)

# Installer output goes to $(VENV)/install.log; a failure prints its tail.
# $(STAMP): everything `make test` runs (the test tools, torch, ray); $(RUN_STAMP): what running a
# node needs (shoal and its dependencies only; no test tools, torch or ray), for `make run`.
$(STAMP): pyproject.toml | $(PY)
	@$(call install,$(TEST_INSTALL),shoal and its test tools)
	@touch $(STAMP)

$(RUN_STAMP): pyproject.toml | $(PY)
	@$(call install,$(RUN_INSTALL),shoal (what running a node needs))
	@touch $(RUN_STAMP)

define install
echo "shoal: installing $(2) into $(VENV) (log: $(VENV)/install.log)"; \
{ $(PY) -m pip install --upgrade pip && $(PY) -m pip install -e $(1); } \
	> $(VENV)/install.log 2>&1 || { tail -n 40 $(VENV)/install.log; exit 1; }
endef

sysdeps:
	@bash .ci/sysdeps.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check config net wal health sync node shoal tests bench examples docs/gen_api.py docs/gen_config.py
	$(VENV)/bin/ruff format --check config net wal health sync node shoal tests bench examples docs/gen_api.py docs/gen_config.py

types: $(STAMP)
	$(VENV)/bin/mypy

check: lint types

# Two workers, each test file on one of them: most tests wait on daemons, timeouts and
# subprocesses rather than compute, so two halve the suite's time on a 2-core machine.
pytest: $(STAMP)
	$(VENV)/bin/pytest -n 2 --dist loadfile

# The docs site (mkdocs.yml): --strict fails on a broken link or anchor; the site goes to site/.
# No --quiet: it hides the warnings that --strict counts, and the build would pass.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

test: sysdeps check docs pytest

# Start one node with embedded defaults: SQLite and state in ./.shoal, API on 127.0.0.1:8770.
run: $(RUN_STAMP)
	@port=$${SHOAL_P2P_PORT:-8770}; \
	echo "shoal: a node at http://127.0.0.1:$$port with state in .shoal (Ctrl-C stops it)"; \
	echo "  try, from another terminal:  .venv/bin/shoal status   .venv/bin/cluster_monitor"; \
	echo "  a local 3-node cluster:      .venv/bin/shoal dev-cluster --nodes 3"
	@$(VENV)/bin/shoal serve --data-dir .shoal

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info site
