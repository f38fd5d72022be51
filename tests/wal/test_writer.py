"""The group-commit writer: batching, backpressure, observer hooks, failed transactions,
timeouts and checkpoints of the SQLite -wal file."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

import wal.writer
from tests.wal.conftest import FAST
from wal import WalConfig, WalError, WalObserver, WriteAheadLog

# Entry types of the caller's own (shoal writes only sync_started and sync_completed).
GAME_RECORDED = "game_recorded"


class CountingObserver:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.pending: list[int] = []

    def on_append(self, latency_s: float) -> None:
        self.latencies.append(latency_s)

    def on_pending(self, count: int) -> None:
        self.pending.append(count)


class BrokenObserver:
    def on_append(self, latency_s: float) -> None:
        raise RuntimeError("metrics down")

    def on_pending(self, count: int) -> None:
        raise RuntimeError("metrics down")


async def wait_until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_concurrent_appends_share_transactions(wal_path: Path) -> None:
    observer = CountingObserver()
    async with WriteAheadLog(wal_path, config=FAST, observer=observer) as wal:
        await asyncio.gather(*(wal.append(GAME_RECORDED, {"n": n}) for n in range(1000)))
    assert len(observer.latencies) == 1000
    assert all(latency >= 0 for latency in observer.latencies)
    assert 1 <= len(observer.pending) <= 10
    assert observer.pending[-1] == 1000


async def test_batches_hold_at_most_max_batch_requests(
    wal_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 100 appends queued behind a held batch, every later batch is cut at exactly
    max_batch requests (a batch of max_batch + 1 fails), and none is lost."""
    sizes: list[int] = []
    held, release = threading.Event(), threading.Event()
    real = wal.writer.apply_batch

    def recording(conn: sqlite3.Connection, requests: list[object], *args: object) -> object:
        sizes.append(len(requests))
        held.set()
        release.wait(timeout=30)
        return real(conn, requests, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(wal.writer, "apply_batch", recording)
    config = WalConfig(max_batch=10)
    async with WriteAheadLog(wal_path, config=config) as log:
        first = asyncio.ensure_future(log.append(GAME_RECORDED, {"n": -1}))
        await wait_until(held.is_set)
        rest = [asyncio.ensure_future(log.append(GAME_RECORDED, {"n": n})) for n in range(100)]
        await asyncio.sleep(0.05)  # let every append reach the writer's queue
        release.set()
        ids = await asyncio.gather(first, *rest)
    assert len(set(ids)) == 101
    assert sum(sizes) == 101
    assert sizes[0] == 1
    assert max(sizes) == 10, sizes
    assert sizes[1:] == [10] * 10, sizes


async def test_observer_sees_pending_count_after_each_batch(wal_path: Path) -> None:
    observer = CountingObserver()
    async with WriteAheadLog(wal_path, config=FAST, observer=observer) as wal:
        first = await wal.append(GAME_RECORDED, {})
        assert observer.pending[-1] == 1
        await wal.append(GAME_RECORDED, {})
        assert observer.pending[-1] == 2
        await wal.commit(first)
        assert observer.pending[-1] == 1
    assert isinstance(observer, WalObserver)


async def test_a_failing_observer_does_not_stop_writes(
    wal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with WriteAheadLog(wal_path, config=FAST, observer=BrokenObserver()) as wal:
        assert await wal.append(GAME_RECORDED, {}) == 1
        assert await wal.append(GAME_RECORDED, {}) == 2
    assert any("observer" in r.getMessage() for r in caplog.records)


def gate_batches(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the writer thread wait on `release` before each batch; `entered` is set on entry."""
    entered, release = threading.Event(), threading.Event()
    real = wal.writer.apply_batch

    def gated(*args: object, **kwargs: object) -> object:
        entered.set()
        release.wait(timeout=30)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(wal.writer, "apply_batch", gated)
    return entered, release


async def test_the_queue_to_the_writer_is_bounded(
    wal_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = gate_batches(monkeypatch)
    config = WalConfig(queue_limit=5, max_batch=2)
    async with WriteAheadLog(wal_path, config=config) as log:
        appends = [asyncio.ensure_future(log.append(GAME_RECORDED, {"n": n})) for n in range(50)]
        await wait_until(entered.is_set)
        await asyncio.sleep(0.05)
        assert (await log.stats()).queue_depth <= 5
        assert not any(a.done() for a in appends)
        release.set()
        ids = await asyncio.gather(*appends)
    assert sorted(ids) == list(range(1, 51))


async def test_a_slow_batch_times_out_and_the_writer_goes_on(
    wal_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with WriteAheadLog(wal_path, config=WalConfig(op_timeout_s=1.0)) as log:
        _, release = gate_batches(monkeypatch)
        with pytest.raises(WalError, match=r"writing timed out after 1\.0 s"):
            await log.append(GAME_RECORDED, {"slow": True})
        release.set()
        later = await log.append(GAME_RECORDED, {"slow": False})
        # The timed-out entry was written after all, just never acknowledged.
        assert later == 2
        assert (await log.stats()).pending == 2


async def test_a_failed_transaction_fails_its_batch_and_writes_resume(
    wal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with WriteAheadLog(wal_path, config=FAST) as log:
        first = await log.append(GAME_RECORDED, {})
        with closing(sqlite3.connect(wal_path, isolation_level=None)) as other:
            other.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON entries WHEN NEW.entry_type = 'poison'"
                " BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
            results = await asyncio.gather(
                log.append("poison", {}),
                *(log.append(GAME_RECORDED, {"n": n}) for n in range(5)),
                return_exceptions=True,
            )
            assert all(isinstance(r, WalError) for r in results)
            assert "injected failure" in str(results[0])
            stats = await log.stats()
            assert (stats.appended_total, stats.last_id, stats.pending) == (1, first, 1)
            other.execute("DROP TRIGGER poison")
        assert await log.append(GAME_RECORDED, {}) == first + 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("a batch failed" in m for m in messages)
    assert any("writes succeed again" in m for m in messages)


async def test_idle_log_truncates_its_sqlite_wal_file(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=FAST) as log:
        await asyncio.gather(*(log.append(GAME_RECORDED, {"n": n}) for n in range(100)))
        wal_file = wal_path.with_name(wal_path.name + "-wal")
        await wait_until(lambda: wal_file.stat().st_size == 0)
        stats = await log.stats()
        assert (stats.wal_file_bytes, stats.pending) == (0, 100)


async def test_busy_log_checkpoints_into_the_database_periodically(wal_path: Path) -> None:
    config = WalConfig(
        wal_autocheckpoint_pages=0, checkpoint_interval_s=0.001, idle_checkpoint_s=3600
    )
    async with WriteAheadLog(wal_path, config=config) as log:
        before = (await log.stats()).db_size_bytes
        for n in range(20):
            await log.append(GAME_RECORDED, {"n": n, "pad": "z" * 2000})
        after = (await log.stats()).db_size_bytes
    assert after > before


async def test_an_open_log_logs_a_failed_checkpoint_and_keeps_going(
    wal_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(conn: sqlite3.Connection, mode: str, busy_s: float) -> tuple[int, int, int]:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(wal.writer, "checkpoint", broken)
    caplog.set_level(logging.WARNING, logger="wal")
    async with WriteAheadLog(wal_path, config=WalConfig(checkpoint_interval_s=0.001)) as log:
        await log.append(GAME_RECORDED, {})
        assert await log.append(GAME_RECORDED, {}) == 2
    assert any("checkpoint failed" in r.getMessage() for r in caplog.records)


async def test_a_crashed_writer_fails_callers_instead_of_hanging(
    wal_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def crash(self: wal.writer.BatchWriter) -> None:
        raise RuntimeError("bug in the writer")

    async with WriteAheadLog(wal_path, config=FAST) as log:
        assert await log.append(GAME_RECORDED, {}) == 1
        monkeypatch.setattr(wal.writer.BatchWriter, "_gather", crash)
        with pytest.raises(WalError, match="writer stopped on an unexpected error"):
            await log.append(GAME_RECORDED, {})
        with pytest.raises(WalError, match="writer stopped on an unexpected error"):
            await log.append(GAME_RECORDED, {})
    assert any("writer stopped" in r.getMessage() for r in caplog.records)
    async with WriteAheadLog(wal_path, config=FAST) as log:
        assert (await log.stats()).appended_total == 1


async def test_a_long_reader_does_not_hold_up_writes_at_idle_checkpoints(wal_path: Path) -> None:
    # A TRUNCATE that waited for the reader would wait busy_timeout_s (60 s) and the append
    # after it would fail its op_timeout_s (10 s).
    config = WalConfig(busy_timeout_s=60.0, op_timeout_s=10.0, idle_checkpoint_s=0.01)
    async with WriteAheadLog(wal_path, config=config) as log:
        await log.append(GAME_RECORDED, {})
        with closing(sqlite3.connect(wal_path, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM entries").fetchone()
            for n in range(5):
                await log.append(GAME_RECORDED, {"n": n})
                await asyncio.sleep(0.05)
            reader.execute("COMMIT")
        wal_file = wal_path.with_name(wal_path.name + "-wal")
        await log.append(GAME_RECORDED, {})
        await wait_until(lambda: wal_file.stat().st_size == 0)
        assert (await log.stats()).pending == 7
