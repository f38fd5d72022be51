"""Warm spare processes for a node's training command (setting `training_spares`): each is the
command's Python with torch and shoal's training modules imported, waiting (shoal._spare). A
worker the launcher (re)starts takes a ready spare and begins in the time its script needs, not
the interpreter's and torch's; the pool then warms a new one. A command that is not a Python
script or module (the spare says `unsupported`) runs without spares, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from config import AsyncClosing

__all__ = ["SPARE_CODE", "Spare", "SparePool", "start_worker"]

log = logging.getLogger(__name__)

SPARE_CODE = "import shoal._spare as spare; spare.main()"
ENV_COMMAND = "SHOAL_SPARE_COMMAND"
"""shoal._spare.ENV_COMMAND: the worker's command, which the spare checks before it warms."""
LINE_BYTES = 4096


class Spare:
    """One spare process; `ready` once it said so. `hand_over` makes it a worker."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ready = asyncio.Event()
        self.unsupported: str | None = None
        self.taken = False
        """Handed to the launcher: its process is a worker's now, ready or not."""

    async def hand_over(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path
    ) -> asyncio.subprocess.Process:
        """Send the worker's command; the spare runs it with `env` in `cwd`, writing to
        `log_path`. Returns the process, now the worker. OSError when the spare is gone."""
        stdin = self.proc.stdin
        if stdin is None or self.proc.returncode is not None:
            raise OSError(f"spare pid {self.proc.pid} is gone")
        order = {"argv": list(argv), "env": dict(env), "cwd": str(cwd), "log": str(log_path)}
        try:
            stdin.write(json.dumps(order).encode() + b"\n")
            await stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise OSError(f"spare pid {self.proc.pid} did not take its command: {exc}") from exc
        finally:
            stdin.close()
        return self.proc

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class SparePool(AsyncClosing):
    """Keeps `size` spares of `command` warm, started in `workdir` with `env` (the workers'
    base environment), their own output before a hand-over going to `log_path`."""

    def __init__(
        self,
        command: Sequence[str],
        workdir: Path,
        env: Mapping[str, str],
        size: int,
        log_path: Path,
    ) -> None:
        self.command = tuple(command)
        self.workdir = workdir
        self.size = size
        self.log_path = log_path
        self._env = {**env, ENV_COMMAND: json.dumps(list(command))}
        self._spares: list[Spare] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting = 0
        """Spares whose process is being created (not yet in `_spares`)."""
        self.unsupported: str | None = None if size > 0 else "training_spares is 0"
        self._closed = False

    @property
    def ready_count(self) -> int:
        return sum(1 for spare in self._spares if spare.ready.is_set())

    def fill(self) -> None:
        """Start spares until `size` are warm or warming (none once the command is found
        unsupported, or after close)."""
        if self._closed or self.unsupported is not None:
            return
        while len(self._spares) + self._starting < self.size:
            self._starting += 1
            task = asyncio.get_running_loop().create_task(self._start(), name="training-spare")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def take(self) -> Spare | None:
        """A spare, no longer the pool's (a new one warms), or None: a ready one first, else
        one still warming (it reads the worker's command once its imports are done: sooner
        than a new process would be)."""
        if self.unsupported is not None:
            return None
        alive = [spare for spare in self._spares if spare.proc.returncode is None]
        for spare in sorted(alive, key=lambda spare: not spare.ready.is_set()):
            self._spares.remove(spare)
            spare.taken = True
            self.fill()
            return spare
        return None

    async def _start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.log_path.open("ab") as output:
                creating = asyncio.ensure_future(
                    asyncio.create_subprocess_exec(
                        self.command[0],
                        "-c",
                        SPARE_CODE,
                        cwd=self.workdir,
                        env=self._env,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=output,
                        start_new_session=True,
                    )
                )
                try:
                    proc = await asyncio.shield(creating)
                except asyncio.CancelledError:
                    # closed while the process was being made: it exists once this returns,
                    # so it is killed and reaped here, never left running
                    made = await creating
                    Spare(made).kill()
                    await made.wait()
                    raise
        finally:
            self._starting -= 1
        spare = Spare(proc)
        self._spares.append(spare)
        try:
            await self._listen(spare)
        finally:
            if not spare.ready.is_set() and not spare.taken:
                if spare in self._spares:
                    self._spares.remove(spare)
                spare.kill()
                await asyncio.shield(spare.proc.wait())

    async def _listen(self, spare: Spare) -> None:
        """Read the spare's word: `ready`, or `unsupported: why` (no more spares are made)."""
        assert spare.proc.stdout is not None
        line = (await spare.proc.stdout.readline())[:LINE_BYTES].decode(errors="replace")
        if line.strip() == "ready":
            spare.ready.set()
            return
        if spare.taken:
            return  # a worker now, stopped before its imports were done: the launcher's concern
        reason = line.strip().removeprefix("unsupported: ") or (
            f"the spare exited {await spare.proc.wait()} before it was ready (see {self.log_path})"
        )
        if self.unsupported is None:
            log.warning("training: no warm spares for %s: %s", self.command[0], reason)
        self.unsupported = reason

    async def close(self) -> None:
        """Kill every spare not handed over; idempotent."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        spares, self._spares = self._spares, []
        for spare in spares:
            spare.kill()
        await asyncio.gather(*(spare.proc.wait() for spare in spares), return_exceptions=True)


async def start_worker(
    pool: SparePool | None,
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    log_file: BinaryIO,
    log_path: Path,
) -> asyncio.subprocess.Process:
    """Start a worker running `command`: in a ready spare of `pool` when there is one (its
    output appended to `log_path`), else as a new process writing to `log_file`. Either way in
    a process group of its own (the launcher signals the group)."""
    spare = None if pool is None else pool.take()
    if spare is not None:
        try:
            return await spare.hand_over(command, env, cwd, log_path)
        except OSError as exc:
            log.warning("training: a spare could not take the worker's command: %s", exc)
            spare.kill()
    elif pool is not None:
        pool.fill()
    return await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log_file,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
