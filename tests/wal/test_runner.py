"""The group commit's thread runner: jobs in order on one thread, outcomes on the loop, cancelled
jobs skipped; and wait_within, its cheaper asyncio.timeout."""

from __future__ import annotations

import asyncio
import threading

import pytest

from wal.runner import ThreadRunner, wait_within


async def test_jobs_run_in_order_on_one_thread_and_errors_reach_the_caller() -> None:
    runner = ThreadRunner(asyncio.get_running_loop(), "test-runner")
    seen: list[tuple[int, str]] = []

    def job(n: int) -> int:
        seen.append((n, threading.current_thread().name))
        if n == 3:
            raise ValueError("three")
        return n * 10

    futures = [runner.submit(job, n) for n in range(5)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    runner.shutdown()
    runner.shutdown()
    await asyncio.to_thread(runner.thread.join, 10)
    assert results[:3] == [0, 10, 20]
    assert results[4] == 40
    assert isinstance(results[3], ValueError)
    assert seen == [(n, "test-runner") for n in range(5)]
    assert not runner.thread.is_alive()
    with pytest.raises(RuntimeError, match="shut down"):
        runner.submit(job, 1)


async def test_a_job_cancelled_before_its_turn_is_skipped() -> None:
    runner = ThreadRunner(asyncio.get_running_loop(), "test-runner")
    gate = threading.Event()
    ran: list[str] = []
    blocker = runner.submit(gate.wait, 10)
    skipped = runner.submit(ran.append, "skipped")
    kept = runner.submit(ran.append, "kept")
    skipped.cancel()
    gate.set()
    assert await blocker is True
    await kept
    runner.shutdown()
    assert ran == ["kept"]


async def test_wait_within_cancels_and_raises_timeout_error() -> None:
    loop = asyncio.get_running_loop()
    slow: asyncio.Future[int] = loop.create_future()
    with pytest.raises(TimeoutError, match=r"not done within 0\.01 s"):
        await wait_within(slow, 0.01)
    assert slow.cancelled()
    quick: asyncio.Future[int] = loop.create_future()
    loop.call_soon(quick.set_result, 5)
    assert await wait_within(quick, 30) == 5
    assert await wait_within(asyncio.ensure_future(asyncio.sleep(0, 7)), None) == 7


async def test_wait_within_passes_on_a_cancellation_of_its_caller() -> None:
    waiting: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(wait_within(waiting, 30))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waiting.cancelled()
