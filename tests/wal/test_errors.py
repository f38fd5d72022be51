"""The wal's one table: sqlite3 and OS errors become the most specific WalError."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from wal import WalBusyError, WalCorruptError, WalDiskFullError, WalError
from wal.errors import translate

PATH = Path("/data/wal/wal.db")


def test_the_table() -> None:
    full = translate(sqlite3.OperationalError("database or disk is full"), PATH, "committing")
    assert isinstance(full, WalDiskFullError)
    assert str(full) == f"{PATH}: committing failed: the disk is full; free space there"
    no_space = translate(OSError(errno.ENOSPC, "No space left on device"), PATH, "opening")
    assert isinstance(no_space, WalDiskFullError)
    busy = translate(sqlite3.OperationalError("database is locked"), PATH, "committing")
    assert isinstance(busy, WalBusyError)
    assert isinstance(busy, TimeoutError)
    damaged = translate(sqlite3.DatabaseError("file is not a database"), PATH, "opening")
    assert isinstance(damaged, WalCorruptError)
    other = translate(sqlite3.OperationalError("disk I/O error"), PATH, "committing")
    assert type(other) is WalError
