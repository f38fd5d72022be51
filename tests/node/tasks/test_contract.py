"""One contract suite for every job-context backend: many tasks, a 10 MB object, remote
tracebacks, wait semantics and named actors."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.tasks import (
    ActorExistsError,
    JobContext,
    ProcessContext,
    RemoteTraceback,
    SyncContext,
    ThreadContext,
)
from tests.node.tasks import contract
from tests.node.tasks.backends import ray_context, shoal_context

TASKS = 1000


def threads_ended(before: set[threading.Thread], timeout_s: float = 10.0) -> list[str]:
    """Names of threads started since `before` that are still alive after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not left or time.monotonic() > deadline:
            return [t.name for t in left]
        time.sleep(0.05)


@pytest.fixture(params=["sync", "thread", "process", "shoal", "ray"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    name = request.param
    before = set(threading.enumerate())
    if name == "sync":
        context: Any = SyncContext()
    elif name == "thread":
        context = ThreadContext(max_workers=4)
    elif name == "process":
        context = ProcessContext(max_workers=2)
    elif name == "shoal":
        context = request.getfixturevalue("shoal_ctx")
    else:
        context = request.getfixturevalue("ray_ctx")
    context.backend_name = name
    try:
        yield context
    finally:
        if name in ("sync", "thread", "process"):
            context.close()
            assert threads_ended(before) == []


@pytest.fixture(scope="module")
def shoal_ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    before = set(threading.enumerate())
    with shoal_context(tmp_path_factory.mktemp("shoal")) as context:
        yield context
    assert threads_ended(before) == []


@pytest.fixture(scope="module")
def ray_ctx() -> Iterator[Any]:
    with ray_context() as context:
        yield context


def test_is_a_job_context(ctx: Any) -> None:
    assert isinstance(ctx, JobContext)


def test_many_tasks(ctx: Any) -> None:
    n = TASKS
    futures = [ctx.run(contract.square, i) for i in range(n)]
    assert [ctx.get(f, timeout_s=120) for f in futures] == [i * i for i in range(n)]
    assert ctx.get(ctx.run(contract.add, 2, b=3), timeout_s=60) == 5
    assert ctx.get(ctx.run(lambda x: x + 1, 41), timeout_s=60) == 42


def test_put_get_of_a_10_mb_object(ctx: Any) -> None:
    blob = os.urandom(10 * 1024 * 1024)
    ref = ctx.put(blob)
    assert ctx.get(ref, timeout_s=60) == blob
    assert ctx.get(ctx.run(contract.size_of, ref), timeout_s=60) == len(blob)


def test_remote_exception_with_its_traceback(ctx: Any) -> None:
    future = ctx.run(contract.failing_task, "seven")
    with pytest.raises(ValueError, match="bad input: seven") as caught:
        ctx.get(future, timeout_s=60)
    cause = caught.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "failing_task" in str(cause)


def test_wait_semantics(ctx: Any, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    if ctx.backend_name == "sync":  # inline: the gate must be open before the task runs
        gate.touch()
    slow = ctx.run(contract.block_on, str(gate), "slow")
    fast = ctx.run(contract.square, 3)
    if ctx.backend_name == "sync":
        assert ctx.wait([slow, fast], num_returns=1, timeout_s=0) == ([slow], [fast])
        return
    ready, pending = ctx.wait([slow, fast], num_returns=1, timeout_s=60)
    assert ready == [fast]
    assert pending == [slow]
    ready, pending = ctx.wait([slow, fast], num_returns=2, timeout_s=0.2)
    assert (ready, pending) == ([fast], [slow])
    gate.touch()
    ready, pending = ctx.wait([slow, fast], num_returns=2, timeout_s=60)
    assert ready == [slow, fast]
    assert pending == []
    assert ctx.get(slow, timeout_s=10) == "slow"
    with pytest.raises(ValueError, match="num_returns"):
        ctx.wait([slow], num_returns=2)


def test_actors_keep_state_and_raise_remote_errors(ctx: Any) -> None:
    counter = ctx.create_actor(contract.Counter, 10)
    futures = [counter.incr.remote() for _ in range(20)]
    assert [ctx.get(f, timeout_s=60) for f in futures] == list(range(11, 31))
    with pytest.raises(KeyError) as caught:
        ctx.get(counter.fail.remote(), timeout_s=60)
    assert "fail" in str(caught.value.__cause__)
    assert ctx.get(counter.get.remote(), timeout_s=60) == 30


def test_named_actors_get_if_exists(ctx: Any) -> None:
    name = f"counter-{ctx.backend_name}-{os.urandom(4).hex()}"
    first = ctx.create_actor(contract.Counter, 0, name=name)
    ctx.get(first.incr.remote(5), timeout_s=60)
    again = ctx.create_actor(contract.Counter, 100, name=name, get_if_exists=True)
    assert ctx.get(again.incr.remote(1), timeout_s=60) == 6
    with pytest.raises(ActorExistsError):
        ctx.create_actor(contract.Counter, 0, name=name)
