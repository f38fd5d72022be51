"""Branches of one simulation, each in a process forked from the same moment (bench/scale_sim.py).

After its members settle, a run of bench/scale_sim.py asks several independent questions of the
same cluster: how long deaths take to be known, how many live members die falsely at each loss
level, how long a partition takes to heal. Each is a branch: a coroutine run in a child process
forked from the parent's simulation at that moment, so every branch starts from the same state
(the same views, timers, and random generators) and branches run on separate cores at once.
A branch's answer comes back as JSON; its figures do not depend on how many run at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from bench.scale_net import VirtualLoop

Branch = Callable[[], Awaitable[object]]


class BranchFailed(RuntimeError):
    """A branch's process ended without an answer."""


def default_jobs() -> int:
    """Branches run at once by default: the CPUs this process may use."""
    return max(1, len(os.sched_getaffinity(0)))


async def _answer(branch: Branch, path: Path) -> None:
    """The child's side: run `branch`, write its answer to `path`, end the process."""
    code = 1
    try:
        value = await branch()
        path.write_text(json.dumps(value))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


async def run_branches(branches: Mapping[str, Branch], jobs: int) -> dict[str, Any]:
    """Each branch's answer, by name. Every branch runs in a child forked from the caller's
    simulation as it stands, at most `jobs` at once; the caller's own simulation does not move
    while they run. A branch that fails raises BranchFailed naming it (its traceback is on
    stderr); children still running are killed. Only a `VirtualLoop` can be forked: a real
    loop's selector would be shared with the children."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualLoop):
        raise TypeError(f"branches fork a simulation: run them on a VirtualLoop, not {loop!r}")
    pending = list(branches.items())
    running: dict[int, tuple[str, Path]] = {}
    answers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="scale-branches-") as where:
        try:
            while pending or running:
                while pending and len(running) < jobs:
                    name, branch = pending.pop(0)
                    path = Path(where) / f"{len(answers) + len(running)}.json"
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        loop.in_branch = True
                        # asyncio knows a running loop only in the process that started it
                        asyncio.events._set_running_loop(loop)
                        await _answer(branch, path)
                    running[pid] = (name, path)
                pid, status = os.wait()
                if pid not in running:
                    continue
                name, path = running.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                if code != 0 or not path.exists():
                    raise BranchFailed(f"branch {name!r} of the simulation failed (exit {code})")
                answers[name] = json.loads(path.read_text())
        finally:
            for pid in running:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    return {name: answers[name] for name in branches}
