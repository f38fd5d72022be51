"""config.quietlog.QuietLog: a repeated failure is logged once at WARNING, then at DEBUG."""

from __future__ import annotations

import logging

import pytest

from config.quietlog import QuietLog


def test_a_repeated_failure_warns_once_until_it_clears(caplog: pytest.LogCaptureFixture) -> None:
    quiet = QuietLog(logging.getLogger("tests.quietlog"))
    with caplog.at_level(logging.DEBUG, logger="tests.quietlog"):
        quiet.failed("peer-a", "peer %s: %s", "a", "refused")
        quiet.failed("peer-a", "peer %s: %s", "a", "refused")
        quiet.failed("peer-b", "peer %s: %s", "b", "refused")
        assert quiet.warned("peer-a")
        quiet.clear("peer-a")
        assert not quiet.warned("peer-a")
        quiet.failed("peer-a", "peer %s: %s", "a", "refused again")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "peer a: refused"),
        (logging.DEBUG, "peer a: refused"),
        (logging.WARNING, "peer b: refused"),
        (logging.WARNING, "peer a: refused again"),
    ]
