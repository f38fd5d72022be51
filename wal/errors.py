"""Exceptions of the wal package: WalError, and under it WalFullError (too many pending entries)
and WalCorruptError (not a shoal WAL, or damaged). sqlite3 and OS errors are translated to these.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

MOVE_ASIDE_HINT = "move it aside with `shoal wal open --move-aside` (wal.move_aside) and restart"

# Primary result codes (the low byte of an extended code) that mean the file itself is damaged.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


class WalError(Exception):
    """Base of every error raised by the wal package."""


class WalFullError(WalError):
    """More than `max_pending` entries are pending; the message carries the count."""

    def __init__(self, message: str, *, pending: int) -> None:
        super().__init__(message)
        self.pending = pending


class WalCorruptError(WalError):
    """The file is not a shoal WAL or is damaged; the message names the file and the fix."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}; {MOVE_ASIDE_HINT}")
        self.path = path
        self.reason = reason


def is_corruption(exc: sqlite3.Error) -> bool:
    """True when SQLite says the database file is malformed or not a database at all."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc)
    return "malformed" in text or "not a database" in text


def translate(exc: sqlite3.Error | OSError, path: Path, doing: str) -> WalError:
    """Map an error of sqlite3 or the OS to the most specific WalError; the caller chains it."""
    if isinstance(exc, sqlite3.Error) and is_corruption(exc):
        return WalCorruptError(path, f"database damaged while {doing} ({exc})")
    return WalError(f"{path}: {doing} failed: {exc}")
