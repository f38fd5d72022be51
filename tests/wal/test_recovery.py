"""recover(): handlers by entry type, commit on success, a retry on failure, harmless twice."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tests.wal.conftest import FAST
from wal import (
    SYNC_COMPLETED,
    SYNC_STARTED,
    EntryState,
    RecoveryResult,
    WalConfig,
    WalEntry,
    WriteAheadLog,
)

# Entry types of the caller's own (shoal writes only sync_started and sync_completed).
GAME_RECORDED = "game_recorded"
MODEL_TRAINED = "model_trained"
EXPORT_STARTED = "export_started"


class Recorder:
    """Handlers that record what they saw; `failing` entry ids raise."""

    def __init__(self, failing: frozenset[int] = frozenset()) -> None:
        self.seen: list[WalEntry] = []
        self.failing = failing

    async def __call__(self, entry: WalEntry) -> None:
        self.seen.append(entry)
        if entry.id in self.failing:
            raise RuntimeError(f"cannot redo {entry.id}")


async def test_recover_after_reopen_runs_handlers_oldest_first(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        sync = await wal.append(SYNC_STARTED, {"peer": "b", "category": "games"})
        game = await wal.append(GAME_RECORDED, {"game_id": "g-1"})
        done = await wal.append(GAME_RECORDED, {"game_id": "g-0"})
        await wal.commit(done)
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        syncs, games = Recorder(), Recorder()
        result = await wal.recover({SYNC_STARTED: syncs, GAME_RECORDED: games})
        assert result == RecoveryResult(recovered=2, failed=0, skipped=0, exhausted=0)
        assert [e.id for e in syncs.seen] == [sync]
        assert syncs.seen[0].payload == {"peer": "b", "category": "games"}
        assert [e.id for e in games.seen] == [game]
        assert await wal.pending() == []
        entry = await wal.get(sync)
        assert entry is not None
        assert entry.state is EntryState.COMMITTED


async def test_failures_count_a_retry_and_unknown_types_stay_pending(
    wal: WriteAheadLog,
) -> None:
    ok = await wal.append(MODEL_TRAINED, {"step": 1})
    bad = await wal.append(MODEL_TRAINED, {"step": 2})
    unknown = await wal.append("custom_op", {})
    handler = Recorder(failing=frozenset({bad}))
    result = await wal.recover({MODEL_TRAINED: handler})
    assert result == RecoveryResult(recovered=1, failed=1, skipped=1, exhausted=0)
    assert [e.id for e in await wal.pending()] == [bad, unknown]
    failed = await wal.get(bad)
    assert failed is not None
    assert (failed.retries, failed.error) == (1, f"RuntimeError: cannot redo {bad}")
    committed = await wal.get(ok)
    assert committed is not None
    assert committed.state is EntryState.COMMITTED


async def test_recovering_twice_is_harmless(wal: WriteAheadLog) -> None:
    ids = [await wal.append(EXPORT_STARTED, {"n": n}) for n in range(3)]
    handler = Recorder(failing=frozenset({ids[1]}))
    first = await wal.recover({EXPORT_STARTED: handler})
    second = await wal.recover({EXPORT_STARTED: handler})
    assert first == RecoveryResult(recovered=2, failed=1, skipped=0, exhausted=0)
    assert second == RecoveryResult(recovered=0, failed=1, skipped=0, exhausted=0)
    assert [e.id for e in handler.seen] == [ids[0], ids[1], ids[2], ids[1]]
    stats = await wal.stats()
    assert (stats.pending, stats.committed_total, stats.retries_total) == (1, 2, 2)


async def test_concurrent_recoveries_run_one_after_the_other(wal: WriteAheadLog) -> None:
    ids = [await wal.append(SYNC_COMPLETED, {"n": n}) for n in range(20)]
    handler = Recorder()
    results = await asyncio.gather(*(wal.recover({SYNC_COMPLETED: handler}) for _ in range(3)))
    assert sorted(r.recovered for r in results) == [0, 0, 20]
    assert [e.id for e in handler.seen] == ids


async def test_retries_exhaust_into_failed(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=WalConfig(max_retries=2)) as wal:
        entry_id = await wal.append(SYNC_STARTED, {})
        handler = Recorder(failing=frozenset({entry_id}))
        assert (await wal.recover({SYNC_STARTED: handler})).exhausted == 0
        assert (await wal.recover({SYNC_STARTED: handler})).exhausted == 1
        assert await wal.recover({SYNC_STARTED: handler}) == RecoveryResult(0, 0, 0, 0)
        entry = await wal.get(entry_id)
        assert entry is not None
        assert (entry.state, entry.retries) == (EntryState.FAILED, 2)


async def test_a_handler_may_finish_its_entry_itself(wal: WriteAheadLog) -> None:
    committed = await wal.append(SYNC_STARTED, {"action": "commit"})
    rolled_back = await wal.append(SYNC_STARTED, {"action": "rollback"})

    async def handler(entry: WalEntry) -> None:
        if entry.payload["action"] == "commit":
            await wal.commit(entry.id)
        else:
            await wal.rollback(entry.id, reason="obsolete")

    result = await wal.recover({SYNC_STARTED: handler})
    assert result == RecoveryResult(recovered=2, failed=0, skipped=0, exhausted=0)
    states = [await wal.get(i) for i in (committed, rolled_back)]
    assert [e.state for e in states if e is not None] == [
        EntryState.COMMITTED,
        EntryState.ROLLED_BACK,
    ]


async def test_entries_appended_during_recovery_are_left_to_their_own_path(
    wal: WriteAheadLog,
) -> None:
    old = await wal.append(SYNC_STARTED, {})
    appended: list[int] = []

    async def handler(entry: WalEntry) -> None:
        appended.append(await wal.append(SYNC_STARTED, {"follow_up_of": entry.id}))

    result = await wal.recover({SYNC_STARTED: handler})
    assert result.recovered == 1
    assert [e.id for e in await wal.pending()] == appended
    assert appended[0] > old


async def test_recovery_pages_through_many_entries(wal: WriteAheadLog) -> None:
    ids = await asyncio.gather(*(wal.append(GAME_RECORDED, {"n": n}) for n in range(1200)))
    handler = Recorder()
    result = await wal.recover({GAME_RECORDED: handler})
    assert result.recovered == 1200
    assert [e.id for e in handler.seen] == sorted(ids)


async def test_cancellation_propagates_and_leaves_the_entry_pending(wal: WriteAheadLog) -> None:
    entry_id = await wal.append(SYNC_STARTED, {})
    started = asyncio.Event()

    async def handler(entry: WalEntry) -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(wal.recover({SYNC_STARTED: handler}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    entry = await wal.get(entry_id)
    assert entry is not None
    assert (entry.state, entry.retries) == (EntryState.PENDING, 0)


async def test_open_reports_pending_entries(
    wal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        for n in range(3):
            await wal.append(GAME_RECORDED, {"n": n})
    caplog.set_level(logging.INFO, logger="wal")
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        stats = await wal.stats()
    assert stats.pending == 3
    assert stats.oldest_pending_age_s is not None
    opened = [r.getMessage() for r in caplog.records if "opened" in r.getMessage()]
    assert len(opened) == 1
    assert "3 pending entries, oldest" in opened[0]
    assert str(wal_path) in opened[0]
