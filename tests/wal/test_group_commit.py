"""The group-commit engine the WAL and the record stores share, through a minimal owner: batches
bounded by weight, errors per request or per batch, close draining the queue."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from wal import GroupCommit, GroupCommitConfig


@dataclass(frozen=True)
class Done:
    results: list[int | Exception]


class OwnerError(Exception):
    pass


class Numbers(GroupCommit[list[int], Done]):
    """Each request is a list of numbers, weighing its length; -1 fails that request alone,
    -2 fails the whole transaction."""

    unit_weight = False

    def __init__(self, config: GroupCommitConfig) -> None:
        super().__init__("numbers", config, closed_reason="closed", thread_name="numbers")
        self.batches: list[list[list[int]]] = []
        self.seen: list[Done | None] = []
        self.queued_at_batch_end: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def weight(self, request: list[int]) -> int:
        return len(request)

    def apply(self, conn: sqlite3.Connection, requests: list[list[int]]) -> Done:
        self.entered.set()
        self.gate.wait(timeout=30)
        self.batches.append(requests)
        results: list[int | Exception] = []
        with conn:
            for numbers in requests:
                if -2 in numbers:
                    raise sqlite3.OperationalError("injected failure")
                if -1 in numbers:
                    results.append(OwnerError("refused -1"))
                    continue
                conn.executemany("INSERT INTO t (v) VALUES (?)", [(n,) for n in numbers])
                results.append(len(numbers))
        return Done(results)

    def checkpoint(self, conn: sqlite3.Connection, mode: str) -> None:
        conn.execute(f"PRAGMA wal_checkpoint({mode})")

    def translate(self, exc: sqlite3.Error | OSError, doing: str) -> Exception:
        return OwnerError(f"{doing} failed: {exc}")

    def failure(self, reason: str) -> Exception:
        return OwnerError(reason)

    def on_batch(self, requests: list[list[int]], outcome: Done | None) -> None:
        self.seen.append(outcome)
        self.queued_at_batch_end.append(self.queue_depth)


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (v INTEGER)")
    return conn


async def opened(tmp_path: Path, max_batch: int = 4, *, eager: bool = False) -> Numbers:
    engine = Numbers(GroupCommitConfig(max_batch=max_batch, op_timeout_s=30.0, eager=eager))
    await engine.open_connection(connect, tmp_path / "n.db")
    engine.start()
    return engine


def rows(tmp_path: Path) -> list[int]:
    with sqlite3.connect(tmp_path / "n.db") as conn:
        return sorted(v for (v,) in conn.execute("SELECT v FROM t"))


async def test_a_batch_takes_requests_while_their_weight_is_below_max_batch(
    tmp_path: Path,
) -> None:
    engine = await opened(tmp_path, max_batch=4)
    engine.gate.clear()
    first = engine.enqueue([0])
    await asyncio.to_thread(engine.entered.wait, 10)
    queued = [engine.enqueue([n] * size) for n, size in enumerate((2, 2, 2, 3, 9), 1)]
    engine.gate.set()
    assert await asyncio.gather(first, *queued) == [1, 2, 2, 2, 3, 9]
    await engine.close()
    # 2+2 reaches 4 and closes a batch; 2 < 4 lets the 3 join; the 9 comes alone.
    assert [[len(r) for r in batch] for batch in engine.batches] == [[1], [2, 2], [2, 3], [9]]
    assert len(rows(tmp_path)) == 19


async def test_an_error_result_fails_only_its_request(tmp_path: Path) -> None:
    engine = await opened(tmp_path)
    engine.gate.clear()
    blocker = engine.enqueue([0])
    await asyncio.to_thread(engine.entered.wait, 10)
    good, bad = engine.enqueue([1]), engine.enqueue([-1])
    engine.gate.set()
    assert await blocker == 1
    assert await good == 1
    with pytest.raises(OwnerError, match="refused -1"):
        await bad
    await engine.close()
    assert [[len(r) for r in batch] for batch in engine.batches] == [[1], [1, 1]]
    assert rows(tmp_path) == [0, 1]


async def test_a_failed_transaction_fails_its_whole_batch_and_writing_goes_on(
    tmp_path: Path,
) -> None:
    engine = await opened(tmp_path)
    engine.gate.clear()
    blocker = engine.enqueue([0])
    await asyncio.to_thread(engine.entered.wait, 10)
    doomed = [engine.enqueue([5]), engine.enqueue([-2])]
    engine.gate.set()
    await blocker
    for future in doomed:
        with pytest.raises(OwnerError, match="writing failed: injected failure"):
            await future
    assert await engine.submit([7]) == 1
    await engine.close()
    assert engine.seen[1] is None
    assert rows(tmp_path) == [0, 7]


async def test_close_writes_what_was_queued_then_refuses(tmp_path: Path) -> None:
    engine = await opened(tmp_path)
    queued = [engine.enqueue([n]) for n in range(10)]
    await engine.close()
    assert all(future.done() for future in queued)
    assert [future.result() for future in queued] == [1] * 10
    with pytest.raises(OwnerError, match="closed"):
        engine.enqueue([11])
    assert rows(tmp_path) == list(range(10))


async def test_callers_are_woken_before_a_partial_next_batch_starts(tmp_path: Path) -> None:
    engine = await opened(tmp_path, max_batch=100)
    engine.gate.clear()
    first = engine.enqueue([0])
    await asyncio.to_thread(engine.entered.wait, 10)
    queued = [engine.enqueue([1]), engine.enqueue([2])]
    engine.gate.set()
    assert await asyncio.gather(first, *queued) == [1, 1, 1]
    await engine.close()
    # the first batch's callers were woken while the other two still waited (free to grow it)
    assert engine.queued_at_batch_end[0] == 2
    assert [[len(r) for r in batch] for batch in engine.batches] == [[1], [1, 1]]


async def test_eager_applies_batch_after_batch_without_the_loop(tmp_path: Path) -> None:
    engine = await opened(tmp_path, max_batch=1, eager=True)
    second_started = threading.Event()
    real_apply = engine.apply

    def apply(conn: sqlite3.Connection, requests: list[list[int]]) -> Done:
        if requests == [[2]]:
            second_started.set()
        return real_apply(conn, requests)

    engine.apply = apply  # type: ignore[method-assign]
    engine.gate.clear()
    first = engine.enqueue([1])
    await asyncio.to_thread(engine.entered.wait, 10)
    second = engine.enqueue([2])
    engine.gate.set()
    # The loop is blocked here (a synchronous wait), yet the thread goes on to the next batch.
    assert second_started.wait(timeout=30)
    assert await asyncio.gather(first, second) == [1, 1]
    await engine.close()
    assert rows(tmp_path) == [1, 2]
