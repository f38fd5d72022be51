"""bench/scale_fork.py: branches of one simulation, each in a child forked from the same moment,
answer by name, start from the same state, leave the parent's simulation where it stood, and a
branch that fails (in its coroutine or in a timer callback of its loop) is named and ends its
child without running the parent's code."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scale_fork import BranchFailed, run_branches
from bench.scale_net import VirtualLoop

ROOT = Path(__file__).resolve().parents[2]


def _run(main: asyncio.Future[object] | object) -> object:
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main)  # type: ignore[arg-type]
    finally:
        loop.close()


def test_branches_start_from_the_same_state_and_leave_the_parent_where_it_stood() -> None:
    async def main() -> object:
        loop = asyncio.get_running_loop()
        state = {"steps": 0, "pid": os.getpid()}
        start = loop.time()

        async def branch(seconds: float) -> list[object]:
            await asyncio.sleep(seconds)
            state["steps"] += 1
            return [state["steps"], loop.time() - start, state["pid"] != os.getpid()]

        answers = await run_branches(
            {f"b{k}": lambda k=k: branch(k) for k in (3, 1, 2)},  # type: ignore[misc]
            jobs=2,
        )
        return answers, state["steps"], loop.time() - start

    answers, steps, moved = _run(main())  # type: ignore[misc]
    assert list(answers) == ["b3", "b1", "b2"]
    assert answers == {"b3": [1, 3.0, True], "b1": [1, 1.0, True], "b2": [1, 2.0, True]}
    assert steps == 0
    assert moved == 0.0


def test_a_failing_branch_is_named() -> None:
    async def fine() -> int:
        await asyncio.sleep(10)
        return 1

    async def broken() -> int:
        await asyncio.sleep(1)
        raise ValueError("the branch's own bug")

    async def main() -> object:
        return await run_branches({"fine": fine, "broken": broken}, jobs=2)

    with pytest.raises(BranchFailed, match="'broken'"):
        _run(main())


def test_only_a_virtual_loop_is_forked() -> None:
    async def main() -> object:
        return await run_branches({"a": lambda: asyncio.sleep(0)}, jobs=1)

    with pytest.raises(TypeError, match="VirtualLoop"):
        asyncio.run(main())  # type: ignore[arg-type]


SCRIPT = """
import asyncio, sys
sys.path.insert(0, {root!r})
from bench.scale_fork import BranchFailed, run_branches
from bench.scale_net import VirtualLoop

def boom() -> None:
    raise RuntimeError("a timer callback's bug")

async def timer_bug() -> int:
    asyncio.get_running_loop().call_later(1.0, boom)
    await asyncio.sleep(5)
    return 1

async def main() -> None:
    try:
        await run_branches({{"timer": timer_bug}}, jobs=1)
    except BranchFailed as exc:
        print("parent:", exc, flush=True)

loop = VirtualLoop()
try:  # as a test runner would: an error is reported, and the next test runs
    loop.run_until_complete(main())
except RuntimeError as exc:
    print("caught:", exc, flush=True)
finally:
    loop.close()
print("after the loop", flush=True)
"""


def test_a_timer_callbacks_error_ends_the_child_not_the_parents_copy() -> None:
    """The error unwinds past the branch's coroutine into frames copied from the parent (here a
    runner that catches errors and goes on); the child must end there, not go on as the parent
    would."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(root=str(ROOT))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "parent: branch 'timer' of the simulation failed (exit 1)"
    assert lines[1:] == ["after the loop"]
    assert "a timer callback's bug" in done.stderr
