"""node's tables: start-up failures a user can fix become one-line StartupErrors (exit 2);
errors of a request to a node become PeerRequestError, with a timeout subclass."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import aiohttp

from config import read_error
from node.errors import (
    MembershipError,
    NodeError,
    PeerRequestError,
    PeerTimeoutError,
    StartupError,
    peer_error,
)
from node.startup import startup_error
from sync import StoreFullError, StoreLockedError
from wal import WalError

DATA = Path("/srv/shoal")


def chained(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


def test_start_up_failures_a_user_can_fix_exit_2_with_one_line() -> None:
    cases = {
        "locked by another process": StoreLockedError(DATA / "g.db", DATA / "g.db.lock"),
        "the disk is full (12 bytes free)": StoreFullError(DATA / "g.db", 12, "g.db: open"),
        "is read-only": chained(
            WalError("open failed"), OSError(errno.EROFS, "Read-only file system")
        ),
        "is not writable": OSError(errno.EACCES, "Permission denied", str(DATA / "wal")),
        "is a file, not a directory": OSError(errno.ENOTDIR, "Not a directory", str(DATA)),
        "UDP port": chained(
            MembershipError("cannot bind membership UDP on 127.0.0.1:8770: in use"),
            OSError(errno.EADDRINUSE, "Address already in use"),
        ),
        "cannot be written": chained(
            WalError("open failed"),
            sqlite3.OperationalError("attempt to write a readonly database"),
        ),
    }
    for expected, exc in cases.items():
        error = startup_error(exc, DATA)
        assert isinstance(error, StartupError), expected
        assert error.command_exit_code == 2
        assert expected in str(error), str(error)
        assert "\n" not in str(error)


def test_other_failures_are_not_start_up_errors() -> None:
    assert startup_error(RuntimeError("bug"), DATA) is None
    assert startup_error(WalError("schema version 9 is newer"), DATA) is None
    assert NodeError.command_exit_code == 1


def test_peer_errors_keep_the_nodes_reason_and_have_a_timeout_subclass() -> None:
    timeout = peer_error(TimeoutError(), "http://n:1/v1/status")
    assert isinstance(timeout, PeerTimeoutError)
    assert isinstance(timeout, TimeoutError)
    refused = peer_error(aiohttp.ClientConnectionError("refused"), "http://n:1")
    assert type(refused) is PeerRequestError
    assert "unreachable" in str(refused)
    body = b'{"error": "insufficient_storage", "reason": "disk full", "status": 507}'
    answer = PeerRequestError.from_answer("http://n:1/v1/x", read_error(507, body))
    assert str(answer) == "http://n:1/v1/x: HTTP 507: disk full (insufficient_storage)"
