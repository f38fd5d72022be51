"""Collectives that give way (shoal.guard) over a fake torch.distributed: an operation that
ends returns, one that fails, stalls past the timeout, or runs while the session has somewhere
else to go raises GroupChanged; other threads and explicit async calls pass through."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from shoal.guard import CollectiveGuard, GroupChanged


class FakeFuture:
    def __init__(self) -> None:
        self._callbacks: list[Any] = []
        self.done = False

    def add_done_callback(self, callback: Any) -> None:
        if self.done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def finish(self) -> None:
        self.done = True
        for callback in self._callbacks:
            callback(self)


class FakeWork:
    """Ends after `after_s` (None: never); `error`: wait() raises it once ended."""

    def __init__(self, after_s: float | None, error: Exception | None = None) -> None:
        self.future = FakeFuture()
        self.error = error
        if after_s is not None:
            timer = threading.Timer(after_s, self.future.finish)
            timer.daemon = True
            timer.start()

    def get_future(self) -> FakeFuture:
        return self.future

    def wait(self) -> bool:
        if self.error is not None:
            raise self.error
        return True


def fake_dist(work: FakeWork) -> SimpleNamespace:
    calls: list[dict[str, Any]] = []

    def all_reduce(tensor: Any, async_op: bool = False) -> FakeWork | None:
        calls.append({"tensor": tensor, "async_op": async_op})
        return work if async_op else None

    return SimpleNamespace(all_reduce=all_reduce, calls=calls)


def test_an_operation_that_ends_returns_like_the_blocking_call() -> None:
    dist = fake_dist(FakeWork(0.05))
    guard = CollectiveGuard(5.0, lambda: None, poll_s=0.01)
    guard.install(dist)
    assert dist.all_reduce("t") is None
    assert dist.calls == [{"tensor": "t", "async_op": True}]
    guard.uninstall()
    dist.all_reduce("u")
    assert dist.calls[-1] == {"tensor": "u", "async_op": False}, "uninstall puts it back"


def test_a_failed_operation_is_a_group_change_naming_it() -> None:
    error = RuntimeError("Connection closed by peer [198.18.0.3]:4242\nmore")
    dist = fake_dist(FakeWork(0.01, error))
    CollectiveGuard(5.0, lambda: None, poll_s=0.01).install(dist)
    with pytest.raises(GroupChanged, match=r"all_reduce failed: Connection closed by peer") as info:
        dist.all_reduce("t")
    assert info.value.__cause__ is error


def test_a_stalled_operation_gives_way_after_the_timeout() -> None:
    dist = fake_dist(FakeWork(None))
    CollectiveGuard(0.2, lambda: None, poll_s=0.01).install(dist)
    started = time.monotonic()
    with pytest.raises(GroupChanged, match=r"did not finish within 0.2 s"):
        dist.all_reduce("t")
    assert time.monotonic() - started >= 0.2


def test_a_newer_group_makes_a_running_operation_give_way() -> None:
    dist = fake_dist(FakeWork(None))
    moved = threading.Event()
    guard = CollectiveGuard(60.0, lambda: "generation 8 is ready" if moved.is_set() else None)
    guard.install(dist)
    threading.Timer(0.1, moved.set).start()
    with pytest.raises(GroupChanged, match="generation 8 is ready"):
        dist.all_reduce("t")
    with pytest.raises(GroupChanged, match="generation 8 is ready"):
        dist.all_reduce("t")  # asked before it starts: no operation is begun
    assert len(dist.calls) == 1


def test_other_threads_and_explicit_async_calls_pass_through() -> None:
    work = FakeWork(None)
    dist = fake_dist(work)
    CollectiveGuard(0.01, lambda: "moving", poll_s=0.01).install(dist)
    assert dist.all_reduce("t", async_op=True) is work
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(dist.all_reduce("u")))
    thread.start()
    thread.join()
    assert answers == [None]
    assert [call["async_op"] for call in dist.calls] == [True, False]
