"""Suite-wide pytest setup: the multi-host harness fixtures (tests/cluster/fixtures.py)."""

pytest_plugins = ["tests.cluster.fixtures"]
