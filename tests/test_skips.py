"""The skip helper: a skip on a developer's machine, a failure under CI's flag."""

from __future__ import annotations

import pytest

from tests.cluster.fixtures import REQUIRE_NETNS_ENV
from tests.skips import skip_unless_required


def test_skips_without_the_ci_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_NETNS_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no tool"):
        skip_unless_required("no tool")


def test_fails_under_the_ci_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_NETNS_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"no tool .*must run here"):
        skip_unless_required("no tool")
