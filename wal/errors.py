"""Exceptions of the wal package, and `translate`, the one table for sqlite3 and OS errors.

WalError -- base of every error raised by the wal package
 +-- WalFullError -- more than `max_pending` entries are pending
 +-- WalCorruptError -- the file is not a shoal WAL, or is damaged
 +-- WalDiskFullError -- the disk holding the WAL is full (ENOSPC, EDQUOT, SQLITE_FULL)
 +-- WalBusyError (also TimeoutError) -- SQLite stayed busy or locked past the busy timeout
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

MOVE_ASIDE_HINT = "move it aside with `shoal wal open --move-aside` (wal.move_aside) and restart"

# Primary result codes (the low byte of an extended code) that mean the file itself is damaged.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
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


class WalDiskFullError(WalError):
    """The disk holding the WAL at `path` is full; the message says what to free."""

    def __init__(self, path: Path, doing: str) -> None:
        super().__init__(f"{path}: {doing} failed: the disk is full; free space there")
        self.path = path


class WalBusyError(WalError, TimeoutError):
    """SQLite stayed busy or locked past the busy timeout (another process holds the file)."""


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_corruption(exc: sqlite3.Error) -> bool:
    """True when SQLite says the database file is malformed or not a database at all."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc)
    return "malformed" in text or "not a database" in text


def translate(exc: sqlite3.Error | OSError, path: Path, doing: str) -> WalError:
    """Map an error of sqlite3 or the OS to the most specific WalError; the caller chains it."""
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return WalDiskFullError(path, doing)
        return WalError(f"{path}: {doing} failed: {exc}")
    if is_corruption(exc):
        return WalCorruptError(path, f"database damaged while {doing} ({exc})")
    code = _primary_code(exc)
    if code == _SQLITE_FULL or "is full" in str(exc):
        return WalDiskFullError(path, doing)
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "database is locked" in str(exc):
        return WalBusyError(f"{path}: {doing} failed: {exc} (another process holds the WAL?)")
    return WalError(f"{path}: {doing} failed: {exc}")
