"""Forked local workers: echo and compute, payloads, death within the timeout, wait_any."""

from __future__ import annotations

import os
import signal
import struct
import time

import pytest

from node.workers import Worker, WorkerDied, WorkerTimeout, wait_any
from tests.node.workers import fns


def test_echo_and_payload() -> None:
    with Worker(fns.echo) as worker:
        worker.send({"hello": [1, 2, 3]})
        assert worker.recv(timeout_s=10) == {"hello": [1, 2, 3]}
        blob = os.urandom(3 * 1024 * 1024)
        worker.send({"n": 1}, blob)
        frame = worker.recv_frame(timeout_s=10)
        assert frame.message == {"n": 1}
        assert frame.payload == blob


def test_compute_on_a_raw_array() -> None:
    values = [float(i) for i in range(10_000)]
    with Worker(fns.compute) as worker:
        worker.send({"op": "sum"}, struct.pack(f"<{len(values)}d", *values))
        reply = worker.recv(timeout_s=10)
        assert reply["sum"] == sum(values)
        assert reply["pid"] == worker.pid != os.getpid()


def test_sigkill_makes_recv_raise_within_its_timeout() -> None:
    worker = Worker(fns.echo)
    try:
        os.kill(worker.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerDied) as caught:
            worker.recv(timeout_s=30)
        assert time.monotonic() - started < 10
        assert caught.value.exit_code == -signal.SIGKILL
        with pytest.raises(WorkerDied):
            worker.send({"after": "death"})
    finally:
        worker.close()


def test_death_reports_exit_code_and_stderr_tail() -> None:
    with Worker(fns.crash) as worker:
        worker.send({"go": True})
        with pytest.raises(WorkerDied) as caught:
            worker.recv(timeout_s=30)
        assert caught.value.exit_code == 3
        assert "the sky is falling" in caught.value.stderr_tail
        assert "the sky is falling" in str(caught.value)


def test_a_silent_live_worker_times_out_without_dying() -> None:
    with Worker(fns.echo) as worker:
        with pytest.raises(WorkerTimeout):
            worker.recv(timeout_s=0.2)
        worker.send("still there")
        assert worker.recv(timeout_s=10) == "still there"


def test_wait_any_returns_exactly_the_ready_workers() -> None:
    workers = [Worker(fns.echo) for _ in range(3)]
    try:
        assert wait_any(workers, timeout_s=0.1) == []
        workers[0].send("a")
        workers[2].send("c")
        seen: set[int] = set()
        deadline = time.monotonic() + 30
        while seen != {0, 2} and time.monotonic() < deadline:
            ready = wait_any(workers, timeout_s=5)
            assert workers[1] not in ready
            seen |= {workers.index(w) for w in ready}
        assert seen == {0, 2}
        assert wait_any(workers, timeout_s=1) == [workers[0], workers[2]]
        assert workers[0].recv(timeout_s=1) == "a"
        assert workers[2].recv(timeout_s=1) == "c"
        assert wait_any(workers, timeout_s=0.1) == []
    finally:
        for worker in workers:
            worker.close()


def test_close_ends_the_process() -> None:
    worker = Worker(fns.echo)
    worker.close()
    assert worker.exit_code is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(worker.pid, os.WNOHANG)
