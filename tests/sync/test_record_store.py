"""RecordStore and RecordStores on real SQLite files: group commit, paging, snapshots, limits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from config import NodeSettings
from sync import (
    GAMES_SCHEMA,
    ROLLOUTS_SCHEMA,
    IngestResult,
    RecordSchemaError,
    RecordStore,
    RecordStores,
    SinceQuery,
    SnapshotError,
    StoreBusyError,
    StoreClosedError,
    StoreOptions,
    StoreWriteError,
    schema_from_mapping,
)
from sync.records import sqlite as store_sqlite
from tests.sync.record_fixtures import SMALL, game, rollout


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RecordStore]:
    async with RecordStore(tmp_path / "games.db", GAMES_SCHEMA, SMALL) as opened:
        yield opened


@contextlib.contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Another connection holds the write lock, so the store's writer waits (a real seam)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


async def wait_until_pending(store: RecordStore, count: int) -> None:
    async with asyncio.timeout(5):
        while store.pending_records < count:
            await asyncio.sleep(0.005)


async def test_duplicates_within_and_across_requests(store: RecordStore) -> None:
    first = await store.ingest([game(1), game(2), game(1), game(3)], "node-a")
    assert first == IngestResult(accepted=3, duplicates=1)
    second = await store.ingest([game(3, winner=None), game(4)], "node-a")
    assert second == IngestResult(accepted=1, duplicates=1)
    [kept] = await store.get(["g-000003"])
    assert kept["winner"] == 1  # a duplicate never changes the stored record
    status = store.status()
    assert (status.store, status.count, status.newest_created_at) == ("games", 4, 1_700_000_004.0)
    assert status.size_bytes > 0


async def test_requests_sharing_a_transaction_get_exact_duplicate_counts(
    store: RecordStore,
) -> None:
    await store.ingest([game(0)], "n")
    with write_locked(store.path):
        tasks = [
            asyncio.create_task(store.ingest([game(1), game(2)], "n")),
            asyncio.create_task(store.ingest([game(2), game(3)], "n")),
            asyncio.create_task(store.ingest([game(1), game(1), game(0)], "n")),
        ]
        await wait_until_pending(store, 7)
        await asyncio.sleep(0.05)
        assert not any(task.done() for task in tasks)  # nothing is answered before COMMIT
    results = await asyncio.gather(*tasks)
    assert results == [IngestResult(2, 0), IngestResult(1, 1), IngestResult(0, 3)]
    assert store.status().count == 4


async def test_a_batch_takes_requests_until_it_holds_max_batch_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[list[int]] = []
    real = store_sqlite.commit_jobs

    def recording(conn: sqlite3.Connection, insert: str, jobs: list[list[object]]) -> object:
        batches.append([len(rows) for rows in jobs])
        return real(conn, insert, jobs)  # type: ignore[arg-type]

    monkeypatch.setattr(store_sqlite, "commit_jobs", recording)
    options = StoreOptions(max_batch_records=4)
    async with RecordStore(tmp_path / "games.db", GAMES_SCHEMA, options) as store:
        with write_locked(store.path):
            blocker = asyncio.create_task(store.ingest([game(0)], "n"))
            async with asyncio.timeout(5):
                while not batches:  # the writer holds the first request, waiting for the lock
                    await asyncio.sleep(0.005)
            tasks = [
                asyncio.create_task(store.ingest([game(3 * i + k) for k in (1, 2, 3)], "n"))
                for i in range(3)
            ]
            await wait_until_pending(store, 10)
        results = await asyncio.gather(blocker, *tasks)
    assert results == [IngestResult(1, 0)] + [IngestResult(3, 0)] * 3
    assert batches == [[1], [3, 3], [3]]


async def test_invalid_request_writes_nothing(store: RecordStore) -> None:
    with pytest.raises(ValueError, match=r"records\[1\]\.winner: expected integer"):
        await store.ingest([game(1), game(2, winner="white")], "n")
    assert store.status().count == 0
    assert await store.get(["g-000001"]) == []


async def test_since_pages_in_time_then_key_order_with_filters(store: RecordStore) -> None:
    records = [game(i, created_at=1000.0 + i // 3) for i in range(40)]
    await store.ingest(records[::-1][:20], "n")
    await store.ingest(records[::-1][20:], "n")
    seen: list[str] = []
    query = SinceQuery(limit=7)
    pages = 0
    while True:
        page = await store.since(query)
        pages += 1
        seen.extend(record["game_id"] for record in page.records)
        if page.next is None:
            break
        query = SinceQuery(ts=page.next[0], after=page.next[1], limit=7)
    expected = sorted(records, key=lambda r: (r["created_at"], r["game_id"]))
    assert seen == [r["game_id"] for r in expected]
    assert pages == 6
    later = await store.since(SinceQuery(ts=1010.0, limit=100))
    assert [r["game_id"] for r in later.records][:1] == ["g-000030"]
    filtered = await store.since(
        SinceQuery(limit=100, minimums=(("quality", 0.5),), equals=(("board_type", "hex8"),))
    )
    assert filtered.records
    assert all(r["quality"] >= 0.5 and r["board_type"] == "hex8" for r in filtered.records)
    assert len(filtered.records) == sum(
        1 for r in records if r["quality"] >= 0.5 and r["board_type"] == "hex8"
    )


async def test_full_queue_waits_then_refuses_with_retry_after(tmp_path: Path) -> None:
    options = StoreOptions(max_pending_records=10, max_wait_s=0.1, retry_after_s=2.0)
    async with RecordStore(tmp_path / "games.db", GAMES_SCHEMA, options) as store:
        with write_locked(store.path):
            first = asyncio.create_task(store.ingest([game(i) for i in range(8)], "n"))
            await wait_until_pending(store, 8)
            with pytest.raises(StoreBusyError) as info:
                await store.ingest([game(i) for i in range(8, 12)], "n")
            assert info.value.retry_after_s == 2.0
            waiting = asyncio.create_task(store.ingest([game(20), game(21)], "n"))
            await asyncio.sleep(0.02)
            assert store.pending_records == 10  # the two that fit were admitted at once
        assert await first == IngestResult(8, 0)
        assert await waiting == IngestResult(2, 0)
        assert store.pending_records == 0
        # a request larger than the whole queue still gets in when the queue is empty
        assert await store.ingest([game(i) for i in range(100, 130)], "n") == IngestResult(30, 0)


async def test_wal_stays_bounded_while_reading_and_truncates_when_idle(tmp_path: Path) -> None:
    options = StoreOptions(
        checkpoint_pages=64, journal_size_limit_bytes=512 * 1024, idle_checkpoint_s=0.1
    )
    wal = Path(f"{tmp_path / 'games.db'}-wal")
    largest = 0
    async with RecordStore(tmp_path / "games.db", GAMES_SCHEMA, options) as store:
        stop = asyncio.Event()

        async def reader() -> None:
            while not stop.is_set():
                await store.since(SinceQuery(ts=1_700_000_000.0 + store.status().count / 2))

        reading = asyncio.create_task(reader())
        moves = ["e2e4"] * 180
        for batch in range(100):
            records = [game(batch * 50 + i, moves=moves) for i in range(50)]
            await store.ingest(records, "n")
            largest = max(largest, wal.stat().st_size)
        stop.set()
        await reading
        assert store.status().count == 5000
        async with asyncio.timeout(5):
            while wal.stat().st_size:
                await asyncio.sleep(0.05)
    assert largest < 3 * 1024 * 1024, largest  # about 7 MB of records went through it


async def test_snapshot_and_merge_insert_or_ignore(tmp_path: Path, store: RecordStore) -> None:
    await store.ingest([game(i) for i in range(100)], "node-a")
    info = await store.snapshot_to(tmp_path / "snaps" / "games-snapshot.db")
    assert (info.records, Path(info.path).name) == (100, "games-snapshot.db")
    assert [p.name for p in (tmp_path / "snaps").iterdir()] == ["games-snapshot.db"]
    async with RecordStore(tmp_path / "other" / "games.db", GAMES_SCHEMA, SMALL) as other:
        await other.ingest([game(i, winner=None) for i in range(90, 120)], "node-b")
        merged = await other.merge_from(Path(info.path), "node-b")
        assert merged == IngestResult(accepted=90, duplicates=10)
        assert other.status().count == 120
        [kept] = await other.get(["g-000095"])
        assert (kept["winner"], kept["source_node"]) == (None, "node-b")
        [copied] = await other.get(["g-000005"])
        assert copied == {**game(5), "source_node": "node-a"}
        again = await other.merge_from(Path(info.path), "node-b")
        assert again == IngestResult(accepted=0, duplicates=100)


async def test_merge_refuses_a_corrupt_or_foreign_snapshot(
    tmp_path: Path, store: RecordStore
) -> None:
    await store.ingest([game(i, moves=["x" * 200] * 20) for i in range(300)], "n")
    info = await store.snapshot_to(tmp_path / "snap.db")
    data = bytearray(Path(info.path).read_bytes())
    page = 4096
    for offset in range(page * 3, len(data) - page, page * 5):
        data[offset + 8 : offset + 300] = os.urandom(292)
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(bytes(data))
    async with RecordStore(tmp_path / "b" / "games.db", GAMES_SCHEMA, SMALL) as other:
        with pytest.raises(SnapshotError, match="integrity check failed"):
            await other.merge_from(corrupt, "n")
        garbage = tmp_path / "garbage.db"
        garbage.write_bytes(b"not a database at all" * 500)
        with pytest.raises(SnapshotError, match="not a readable SQLite database"):
            await other.merge_from(garbage, "n")
        with pytest.raises(SnapshotError, match="no such snapshot"):
            await other.merge_from(tmp_path / "missing.db", "n")
        assert other.status().count == 0
    async with RecordStore(tmp_path / "rollouts.db", ROLLOUTS_SCHEMA, SMALL) as rollouts:
        await rollouts.ingest([rollout(1)], "n")
        with pytest.raises(SnapshotError, match="has no table 'rollouts'"):
            await rollouts.merge_from(Path(info.path), "n")


async def test_close_is_idempotent_and_reopen_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "games.db"
    store = RecordStore(path, GAMES_SCHEMA, SMALL)
    await store.open()
    await store.ingest([game(i) for i in range(5)], "n")
    with pytest.raises(StoreWriteError, match="another process"):
        await RecordStore(path, GAMES_SCHEMA, SMALL).open()
    await asyncio.gather(store.close(), store.close())
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.ingest([game(9)], "n")
    with pytest.raises(StoreClosedError):
        await store.open()
    async with RecordStore(path, GAMES_SCHEMA, SMALL) as again:
        assert (again.status().count, again.status().newest_created_at) == (5, 1_700_000_004.0)
        assert await again.ingest([game(4), game(5)], "n") == IngestResult(1, 1)


async def test_a_table_of_another_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "games.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE games (game_id TEXT PRIMARY KEY, created_at REAL)")
    with pytest.raises(StoreWriteError, match="lacks columns"):
        await RecordStore(path, GAMES_SCHEMA, SMALL).open()


async def test_record_stores_open_the_built_ins_in_their_category_dirs(tmp_path: Path) -> None:
    settings = NodeSettings(data_dir=tmp_path, storage_paths={"rollouts": tmp_path / "fast"})
    evals = schema_from_mapping(
        "evals",
        {"key": "eval_id", "time_column": "at", "fields": {"eval_id": "text", "at": "real"}},
    )
    stores = RecordStores.for_settings(settings, extra_schemas=[evals])
    assert stores.paths == {
        "evals": tmp_path / "records" / "evals.db",
        "games": tmp_path / "games" / "games.db",
        "rollouts": tmp_path / "fast" / "rollouts.db",
    }
    with pytest.raises(RecordSchemaError, match="declared twice"):
        RecordStores(tmp_path, extra_schemas=[GAMES_SCHEMA])
    assert len(stores) == 0
    async with stores:
        assert sorted(stores) == ["evals", "games", "rollouts"]
        assert await stores["evals"].ingest([{"eval_id": "e1", "at": 1}], "n") == IngestResult(1)
        assert stores["games"].options.busy_timeout_s == settings.timeouts.sqlite_busy_s
        await stores["rollouts"].ingest([rollout(1)], "n")
    await stores.close()
    assert len(stores) == 0
    assert (tmp_path / "fast" / "rollouts.db").exists()


async def test_close_commits_what_was_admitted_and_refuses_what_waits(tmp_path: Path) -> None:
    options = StoreOptions(max_pending_records=5, max_wait_s=10)
    store = RecordStore(tmp_path / "games.db", GAMES_SCHEMA, options)
    await store.open()
    with write_locked(store.path):
        admitted = asyncio.create_task(store.ingest([game(i) for i in range(5)], "n"))
        await wait_until_pending(store, 5)
        waiting = asyncio.create_task(store.ingest([game(9)], "n"))
        await asyncio.sleep(0.02)
        closing = asyncio.create_task(store.close())
        with pytest.raises(StoreClosedError):
            await waiting
        await asyncio.sleep(0.02)
        assert not closing.done()  # the admitted batch is still being committed
    assert await admitted == IngestResult(5, 0)
    await closing
    async with RecordStore(tmp_path / "games.db", GAMES_SCHEMA, options) as again:
        assert again.status().count == 5
