"""Replay of pending entries after a restart: each entry's handler runs once per pass, oldest
first; success commits it, an exception counts a retry, an unknown type stays pending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from wal.entry import EntryState, RecoveryHandler, RecoveryResult, WalEntry

logger = logging.getLogger(__name__)

RECOVERY_PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class RecoveryOps:
    """What a recovery pass needs from the log; given by WriteAheadLog.recover.

    read_page(after_id, limit) lists pending entries; finish(entry_id) commits one and returns
    its state afterwards; fail(entry_id, error) counts a retry and returns the state afterwards.
    Neither raises for an entry that is no longer pending: they return the state it has.
    """

    read_page: Callable[[int, int], Awaitable[list[WalEntry]]]
    finish: Callable[[int], Awaitable[EntryState]]
    fail: Callable[[int, str], Awaitable[EntryState]]


def describe_pending(count: int, oldest_age_s: float | None) -> str:
    """The one-line report of pending entries logged when a WAL opens."""
    if count == 0 or oldest_age_s is None:
        return "no pending entries"
    return f"{count} pending entries, oldest {oldest_age_s:.1f} s old"


async def run_recovery(
    ops: RecoveryOps,
    handlers: Mapping[str, RecoveryHandler],
    *,
    up_to_id: int,
    page_size: int = RECOVERY_PAGE_SIZE,
) -> RecoveryResult:
    """Run the handler of every entry pending now with id <= up_to_id, oldest first.

    Entries appended after the pass began are left to their own code path. A handler may
    commit or roll back its entry itself. CancelledError propagates and leaves the entry pending.
    """
    started = time.monotonic()
    recovered = failed = skipped = exhausted = 0
    after_id = 0
    done = False
    while not done:
        page = await ops.read_page(after_id, page_size)
        done = len(page) < page_size
        for entry in page:
            if entry.id > up_to_id:
                done = True
                break
            after_id = entry.id
            handler = handlers.get(entry.entry_type)
            if handler is None:
                skipped += 1
                continue
            try:
                await handler(entry)
            except Exception as exc:
                failed += 1
                error = f"{type(exc).__name__}: {exc}"
                logger.warning(
                    "WAL recovery: handler of entry %s (%s) raised %s",
                    entry.id,
                    entry.entry_type,
                    error,
                )
                if await ops.fail(entry.id, error) is EntryState.FAILED:
                    exhausted += 1
                continue
            state = await ops.finish(entry.id)
            if state is not EntryState.COMMITTED:
                logger.info("WAL recovery: handler of entry %s left it %s", entry.id, state.value)
            recovered += 1
    result = RecoveryResult(recovered, failed, skipped, exhausted)
    logger.info(
        "WAL recovery in %.2f s: %s recovered, %s failed (%s exhausted), %s without a handler",
        time.monotonic() - started,
        recovered,
        failed,
        exhausted,
        skipped,
    )
    return result
