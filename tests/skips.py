"""Skips that CI turns into failures: a test that needs a system tool or root skips with its
reason on a developer's machine, and fails under `SHOAL_REQUIRE_NETNS=1` (CI runs as root with
every tool `.ci/sysdeps.sh` installs), so nothing is skipped there quietly."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from tests.cluster.fixtures import REQUIRE_NETNS_ENV


def skip_unless_required(reason: str) -> NoReturn:
    """Skip the running test with `reason`, or fail it when CI requires every test to run."""
    if os.environ.get(REQUIRE_NETNS_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_NETNS_ENV}=1: this test must run here)")
    pytest.skip(reason)
