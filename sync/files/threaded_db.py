"""A SQLite connection owned by one worker thread (the manifest cache's and the tombstone
store's): run a function on that thread, and close the connection there."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sync.errors import FileSyncError

T = TypeVar("T")


async def run_on_thread(
    executor: ThreadPoolExecutor | None, where: str, fn: Callable[..., T], *args: object
) -> T:
    """`fn(*args)` on the connection's thread; FileSyncError naming `where` when it is closed
    (`executor` None) or SQLite fails."""
    if executor is None:
        raise FileSyncError(f"{where} is closed")
    try:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
    except sqlite3.Error as exc:
        raise FileSyncError(f"{where}: {exc}") from exc


async def close_on_thread(
    executor: ThreadPoolExecutor | None, db: sqlite3.Connection | None
) -> None:
    """Close `db` on its thread, then let the thread go."""
    if executor is None:
        return
    try:
        if db is not None:
            await asyncio.get_running_loop().run_in_executor(executor, db.close)
    finally:
        executor.shutdown(wait=False)
