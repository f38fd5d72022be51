"""WriteAheadLog: state changes, idempotent keys, limits, concurrency, durable state, lifecycle."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.wal.conftest import FAST
from wal import (
    SYNC_STARTED,
    EntryState,
    WalConfig,
    WalEntry,
    WalError,
    WalFullError,
    WriteAheadLog,
)

# Entry types of the caller's own (shoal writes only sync_started and sync_completed).
GAME_RECORDED = "game_recorded"


async def test_append_returns_a_durable_pending_entry(wal: WriteAheadLog) -> None:
    entry_id = await wal.append(GAME_RECORDED, {"game_id": "g-1"}, key="g-1")
    entry = await wal.get(entry_id)
    assert isinstance(entry, WalEntry)
    assert entry.id == entry_id
    assert entry.entry_type == GAME_RECORDED
    assert entry.key == "g-1"
    assert entry.payload == {"game_id": "g-1"}
    assert entry.state is EntryState.PENDING
    assert entry.retries == 0
    assert entry.error is None
    assert entry.created_at == entry.updated_at
    with closing(sqlite3.connect(wal.path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        row = conn.execute("SELECT state FROM entries WHERE id = ?", (entry_id,)).fetchone()
    assert row == ("pending",)


async def test_commit_finishes_an_entry_and_is_idempotent(wal: WriteAheadLog) -> None:
    entry_id = await wal.append(GAME_RECORDED, {"game_id": "g-1"})
    await wal.commit(entry_id)
    await wal.commit(entry_id)
    entry = await wal.get(entry_id)
    assert entry is not None
    assert entry.state is EntryState.COMMITTED
    assert entry.updated_at >= entry.created_at
    assert await wal.pending() == []


async def test_rollback_keeps_the_reason(wal: WriteAheadLog) -> None:
    entry_id = await wal.append(SYNC_STARTED, {"peer": "a"})
    await wal.rollback(entry_id, reason="peer left")
    entry = await wal.get(entry_id)
    assert entry is not None
    assert entry.state is EntryState.ROLLED_BACK
    assert entry.error == "peer left"


async def test_fail_counts_retries_until_max_retries(wal_path: Path) -> None:
    config = WalConfig(max_retries=3)
    async with WriteAheadLog(wal_path, config=config) as wal:
        entry_id = await wal.append(SYNC_STARTED, {"peer": "a"})
        assert await wal.fail(entry_id, error="timeout 1") is EntryState.PENDING
        assert await wal.fail(entry_id, error="timeout 2") is EntryState.PENDING
        entry = await wal.get(entry_id)
        assert entry is not None
        assert (entry.retries, entry.error, entry.state) == (2, "timeout 2", EntryState.PENDING)
        assert await wal.fail(entry_id, error="timeout 3") is EntryState.FAILED
        entry = await wal.get(entry_id)
        assert entry is not None
        assert (entry.retries, entry.state) == (3, EntryState.FAILED)
        with pytest.raises(WalError, match="already failed"):
            await wal.fail(entry_id, error="again")
        stats = await wal.stats()
        assert (stats.failed, stats.failed_total, stats.retries_total) == (1, 1, 3)


async def test_finishing_a_finished_entry_another_way_is_refused(wal: WriteAheadLog) -> None:
    entry_id = await wal.append(GAME_RECORDED, {})
    await wal.rollback(entry_id, reason="no")
    with pytest.raises(WalError, match="already rolled_back; cannot commit"):
        await wal.commit(entry_id)
    other = await wal.append(GAME_RECORDED, {})
    await wal.commit(other)
    with pytest.raises(WalError, match="already committed; cannot roll back"):
        await wal.rollback(other, reason="late")


async def test_unknown_entry_id_is_an_error(wal: WriteAheadLog) -> None:
    with pytest.raises(WalError, match="no WAL entry with id 999"):
        await wal.commit(999)
    with pytest.raises(WalError, match="no WAL entry with id 999"):
        await wal.fail(999, error="x")
    assert await wal.get(999) is None


async def test_same_key_returns_the_existing_entry(wal: WriteAheadLog) -> None:
    first = await wal.append(GAME_RECORDED, {"n": 1}, key="g-1")
    again = await wal.append(GAME_RECORDED, {"n": 2}, key="g-1")
    assert again == first
    concurrent = await asyncio.gather(
        *(wal.append(GAME_RECORDED, {"n": i}, key="g-2") for i in range(50))
    )
    assert len(set(concurrent)) == 1
    assert concurrent[0] != first
    await wal.commit(first)
    assert await wal.append(GAME_RECORDED, {"n": 3}, key="g-1") == first
    stats = await wal.stats()
    assert stats.appended_total == 2
    entry = await wal.get(first)
    assert entry is not None
    assert entry.payload == {"n": 1}


async def test_pending_lists_oldest_first_and_filters_by_type(wal: WriteAheadLog) -> None:
    ids = [await wal.append(GAME_RECORDED if i % 2 else SYNC_STARTED, {"i": i}) for i in range(6)]
    await wal.commit(ids[2])
    pending = await wal.pending()
    assert [e.id for e in pending] == [ids[0], ids[1], ids[3], ids[4], ids[5]]
    syncs = await wal.pending(SYNC_STARTED)
    assert [e.id for e in syncs] == [ids[0], ids[4]]
    assert [e.id for e in await wal.pending(limit=2)] == [ids[0], ids[1]]


async def test_thousand_concurrent_appends_are_each_acknowledged_once(
    wal: WriteAheadLog,
) -> None:
    ids = await asyncio.gather(*(wal.append(GAME_RECORDED, {"n": n}) for n in range(1000)))
    assert len(set(ids)) == 1000
    pending = await wal.pending()
    assert sorted(ids) == [e.id for e in pending]
    assert {e.id: e.payload["n"] for e in pending} == dict(zip(ids, range(1000), strict=True))
    stats = await wal.stats()
    assert (stats.pending, stats.appended_total, stats.last_id) == (1000, 1000, max(ids))


async def test_concurrent_transitions_and_appends_mix(wal: WriteAheadLog) -> None:
    ids = await asyncio.gather(*(wal.append(GAME_RECORDED, {"n": n}) for n in range(300)))
    ops = [wal.commit(i) for i in ids[:100]]
    ops += [wal.rollback(i, reason="r") for i in ids[100:200]]
    ops += [wal.append(SYNC_STARTED, {"n": n}) for n in range(100)]
    await asyncio.gather(*ops)
    stats = await wal.stats()
    assert (stats.pending, stats.committed, stats.rolled_back) == (200, 100, 100)
    assert stats.appended_total == 400


async def test_max_pending_raises_wal_full_with_the_count(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=WalConfig(max_pending=10)) as wal:
        ids = [await wal.append(GAME_RECORDED, {}) for _ in range(10)]
        with pytest.raises(WalFullError, match="10 entries pending") as caught:
            await wal.append(GAME_RECORDED, {})
        assert caught.value.pending == 10
        assert isinstance(caught.value, WalError)
        await wal.commit(ids[0])
        await wal.append(GAME_RECORDED, {})


async def test_max_pending_counts_appends_in_flight(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=WalConfig(max_pending=10)) as wal:
        results = await asyncio.gather(
            *(wal.append(GAME_RECORDED, {}) for _ in range(25)), return_exceptions=True
        )
        assert sum(isinstance(r, int) for r in results) == 10
        assert all(isinstance(r, WalFullError) for r in results if not isinstance(r, int))
        assert (await wal.stats()).pending == 10


async def test_payload_over_the_limit_is_refused(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=WalConfig(max_payload_bytes=100)) as wal:
        with pytest.raises(WalError, match="max_payload_bytes limit of 100"):
            await wal.append(GAME_RECORDED, {"blob": "x" * 200})
        await wal.append(GAME_RECORDED, {"blob": "x" * 50})
        assert (await wal.stats()).appended_total == 1


@pytest.mark.parametrize(
    ("entry_type", "payload", "key", "message"),
    [
        ("", {}, None, "entry_type"),
        ("x" * 129, {}, None, "entry_type"),
        (GAME_RECORDED, {"x": object()}, None, "not JSON-serialisable"),
        (GAME_RECORDED, {"x": float("nan")}, None, "not JSON-serialisable"),
        (GAME_RECORDED, {}, "", "key"),
        (GAME_RECORDED, ["not", "a", "mapping"], None, "payload must be a mapping"),
    ],
)
async def test_invalid_appends_are_refused(
    wal: WriteAheadLog, entry_type: str, payload: Any, key: str | None, message: str
) -> None:
    with pytest.raises(WalError, match=message):
        await wal.append(entry_type, payload, key=key)


async def test_state_is_durable_across_reopen(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        assert await wal.state_get("term") is None
        assert await wal.state_get("term", default=0) == 0
        await wal.state_set("term", 7)
        await wal.state_set("vote", {"term": 7, "for": "node-b"})
        await wal.state_set("term", 8)
        with pytest.raises(WalError, match="not JSON-serialisable"):
            await wal.state_set("bad", {1, 2})
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        assert await wal.state_get("term") == 8
        assert await wal.state_get("vote") == {"term": 7, "for": "node-b"}
        assert await wal.state_get("bad") is None


async def test_entries_and_counters_survive_reopen(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        first = await wal.append(GAME_RECORDED, {"n": 1})
        await wal.commit(await wal.append(GAME_RECORDED, {"n": 2}))
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        assert [e.id for e in await wal.pending()] == [first]
        later = await wal.append(GAME_RECORDED, {"n": 3})
        assert later == first + 2
        stats = await wal.stats()
        assert (stats.appended_total, stats.committed_total, stats.pending) == (3, 1, 2)


async def test_stats_fields(wal: WriteAheadLog) -> None:
    empty = await wal.stats()
    assert empty.pending == 0
    assert empty.oldest_pending_age_s is None
    assert empty.db_size_bytes > 0
    ids = [await wal.append(GAME_RECORDED, {"n": n}) for n in range(4)]
    await wal.commit(ids[0])
    await wal.rollback(ids[1], reason="x")
    await wal.fail(ids[2], error="boom")
    stats = await wal.stats()
    assert stats.pending == 2
    assert (stats.committed, stats.rolled_back, stats.failed) == (1, 1, 0)
    assert (stats.appended_total, stats.committed_total, stats.rolled_back_total) == (4, 1, 1)
    assert (stats.failed_total, stats.retries_total, stats.removed_total) == (0, 1, 0)
    assert stats.oldest_pending_age_s is not None
    assert stats.oldest_pending_age_s >= 0
    assert stats.wal_file_bytes > 0
    assert stats.queue_depth == 0
    assert stats.last_id == ids[-1]


async def test_cleanup_removes_only_old_finished_entries(wal: WriteAheadLog) -> None:
    ids = [await wal.append(GAME_RECORDED, {"n": n}) for n in range(5)]
    await wal.commit(ids[0])
    await wal.rollback(ids[1], reason="x")
    for _ in range(FAST.max_retries):
        await wal.fail(ids[2], error="boom")
    assert await wal.cleanup(older_than_s=3600) == 0
    assert await wal.cleanup(older_than_s=-1) == 3
    assert [await wal.get(i) for i in ids[:3]] == [None, None, None]
    assert [e.id for e in await wal.pending()] == ids[3:]
    stats = await wal.stats()
    assert (stats.committed, stats.rolled_back, stats.failed, stats.pending) == (0, 0, 0, 2)
    assert (stats.removed_total, stats.committed_total, stats.failed_total) == (3, 1, 1)
    assert await wal.cleanup(older_than_s=-1) == 0
    assert await wal.append(GAME_RECORDED, {}) == ids[-1] + 1


async def test_use_before_open_and_after_close_raises(wal_path: Path) -> None:
    wal = WriteAheadLog(wal_path, config=FAST)
    with pytest.raises(WalError, match="not open"):
        await wal.append(GAME_RECORDED, {})
    with pytest.raises(WalError, match="not open"):
        await wal.pending()
    await wal.open()
    entry_id = await wal.append(GAME_RECORDED, {})
    await wal.close()
    await wal.close()
    for call in (
        wal.append(GAME_RECORDED, {}),
        wal.commit(entry_id),
        wal.rollback(entry_id),
        wal.fail(entry_id, error="x"),
        wal.pending(),
        wal.get(entry_id),
        wal.stats(),
        wal.cleanup(),
        wal.state_get("x"),
        wal.state_set("x", 1),
        wal.recover({}),
    ):
        with pytest.raises(WalError, match="closed"):
            await call
    with pytest.raises(WalError, match="already opened"):
        await wal.open()


async def test_close_waits_for_queued_writes(wal_path: Path) -> None:
    wal = WriteAheadLog(wal_path, config=FAST)
    await wal.open()
    appends = [asyncio.ensure_future(wal.append(GAME_RECORDED, {"n": n})) for n in range(200)]
    await asyncio.sleep(0)
    await wal.close()
    ids = [await a for a in appends]
    assert len(set(ids)) == 200
    async with WriteAheadLog(wal_path, config=FAST) as reopened:
        assert (await reopened.stats()).pending == 200


async def test_a_second_log_on_the_same_file_in_one_process_is_refused(
    wal: WriteAheadLog,
) -> None:
    other = WriteAheadLog(wal.path.parent / "." / wal.path.name, config=FAST)
    with pytest.raises(WalError, match="already open by another WriteAheadLog"):
        await other.open()
    await other.close()
    third = WriteAheadLog(wal.path, config=FAST)
    with pytest.raises(WalError, match="already open by another WriteAheadLog"):
        await third.open()
    assert await wal.append(GAME_RECORDED, {}) == 1


async def test_the_file_can_be_opened_again_after_close(wal_path: Path) -> None:
    for _ in range(3):
        async with WriteAheadLog(wal_path, config=FAST) as wal:
            await wal.append(GAME_RECORDED, {})
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        assert (await wal.stats()).appended_total == 3


async def test_close_truncates_the_sqlite_wal_file(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        await asyncio.gather(*(wal.append(GAME_RECORDED, {"n": n}) for n in range(200)))
        assert (await wal.stats()).wal_file_bytes > 0
    wal_file = wal_path.with_name(wal_path.name + "-wal")
    assert not wal_file.exists() or wal_file.stat().st_size == 0


async def test_rollback_without_reason_stores_no_error(wal: WriteAheadLog) -> None:
    entry_id = await wal.append(GAME_RECORDED, {})
    await wal.rollback(entry_id)
    entry = await wal.get(entry_id)
    assert entry is not None
    assert (entry.state, entry.error) == (EntryState.ROLLED_BACK, None)


async def test_invalid_stored_json_is_a_wal_error(wal: WriteAheadLog) -> None:
    entry_id = await wal.append(GAME_RECORDED, {})
    with closing(sqlite3.connect(wal.path, isolation_level=None)) as other:
        other.execute("UPDATE entries SET payload = '{broken' WHERE id = ?", (entry_id,))
    with pytest.raises(WalError, match="invalid stored JSON"):
        await wal.get(entry_id)


async def test_concurrent_closes_all_return(wal_path: Path) -> None:
    wal = WriteAheadLog(wal_path, config=FAST)
    await wal.open()
    await wal.append(GAME_RECORDED, {})
    await asyncio.gather(wal.close(), wal.close(), wal.close())
    await wal.close()


async def test_a_cancelled_append_is_still_written_once_queued(wal: WriteAheadLog) -> None:
    task = asyncio.create_task(wal.append(GAME_RECORDED, {"n": 1}))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wal.append(GAME_RECORDED, {"n": 2}) == 2
    stats = await wal.stats()
    assert (stats.appended_total, stats.pending) == (2, 2)


async def test_entries_of_pages_the_history_of_some_types_in_every_state(
    wal: WriteAheadLog,
) -> None:
    started = await wal.append("job.start", {"job_id": "a"})
    await wal.append(GAME_RECORDED, {"game": 1})
    killed = await wal.append("job.kill", {"job_id": "a"})
    await wal.commit(started)
    await wal.rollback(killed, reason="no such job")
    later = await wal.append("job.start", {"job_id": "b"})
    types = ("job.start", "job.kill")
    found = await wal.entries_of(types)
    assert [(e.id, e.state) for e in found] == [
        (started, EntryState.COMMITTED),
        (killed, EntryState.ROLLED_BACK),
        (later, EntryState.PENDING),
    ]
    assert [e.id for e in await wal.entries_of(types, after_id=started, limit=1)] == [killed]
    cut = found[-1].created_at
    since = [e.id for e in await wal.entries_of(types, since=cut)]
    assert since == [e.id for e in found if e.created_at >= cut]
    assert later in since
    assert await wal.entries_of(()) == []
    assert await wal.entries_of(("job.start",), since=cut + 3600) == []
