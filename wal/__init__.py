"""Durable write-ahead log of a shoal node: operations that must survive a crash, group-committed
to SQLite (WAL mode, synchronous=FULL), their recovery, and the node's small durable state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from wal.entry import (
        BUILTIN_ENTRY_TYPES,
        SYNC_COMPLETED,
        SYNC_STARTED,
        EntryState,
        RecoveryHandler,
        RecoveryResult,
        WalConfig,
        WalEntry,
        WalObserver,
        WalStats,
    )
    from wal.errors import WalBusyError, WalCorruptError, WalDiskFullError, WalError, WalFullError
    from wal.group_commit import BatchResults, GroupCommit, GroupCommitConfig
    from wal.log import WriteAheadLog
    from wal.schema import move_aside
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
