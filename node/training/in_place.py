"""In-place supervision of a node's training workers (`training_reform: in_place`): a new
generation is handed to the running workers, which re-form their group themselves
(shoal.session.reform); a worker that exits starts again alone; a stopped one (a hang) is
killed and started in the new generation. TrainingLauncher takes it in as a mixin: the
attributes and methods declared below are the launcher's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from node.training.rendezvous import Rendezvous
from node.training.torchrun import node_place
from node.training.workers import LauncherState, restart_delay_s, signal_group

log = logging.getLogger(__name__)


@dataclass
class _Slots:
    """The workers of one in-place supervision, by local rank: the latest process, when it
    started, its failures in a row; the local ranks that finished (exit 0), and the pids the
    supervisor killed itself (stopped workers: their exit is no failure)."""

    now: Callable[[], float]
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    finished: set[int] = field(default_factory=set)
    retired: set[int] = field(default_factory=set)

    def running(self) -> dict[int, asyncio.subprocess.Process]:
        return {i: proc for i, proc in enumerate(self.procs) if i not in self.finished}

    def backoff_s(self, index: int, healthy_s: float, backoff_s: float, most_s: float) -> float:
        """The wait before starting worker `index` again after a failure: none for the first
        after it ran `healthy_s`, then doubling from `backoff_s` (restart_delay_s)."""
        healthy = self.now() - self.started_at[index] >= healthy_s
        self.failures[index] = 1 if healthy else self.failures[index] + 1
        if self.failures[index] == 1:
            return 0.0
        return restart_delay_s(self.failures[index] - 1, backoff_s, most_s)


class InPlaceSupervision:
    """The in-place half of node.training.launcher.TrainingLauncher."""

    in_place: bool
    command: tuple[str, ...]
    _current: Rendezvous | None
    _task: asyncio.Task[None] | None
    _state: LauncherState
    _starts: int
    _restarts: int
    _last_exit_code: int | None
    _last_error: str | None
    _workers: tuple[tuple[int, asyncio.subprocess.Process], ...]
    _handed_over: asyncio.Event
    _restart_on_success: bool
    _healthy_after_s: float
    _backoff_s: float
    _max_backoff_s: float
    _on_failure: Callable[[int, str], None] | None

    if TYPE_CHECKING:  # the launcher's, for mypy

        async def _spawn(
            self, rendezvous: Rendezvous, local_rank: int, *, after_generation: int | None = None
        ) -> asyncio.subprocess.Process: ...

        async def _terminate(self, procs: Sequence[asyncio.subprocess.Process]) -> None: ...

        def _count_failure(self) -> bool: ...

        async def _give_up(
            self, generation: int, procs: Sequence[asyncio.subprocess.Process]
        ) -> None: ...

    def _hands_over(self, wanted: Rendezvous) -> bool:
        """In place: the workers running now take `wanted`'s generation themselves (this node
        keeps its number of local ranks, and its supervisor is running)."""
        if not self.in_place or self._task is None or self._task.done():
            return False
        if self._state not in (LauncherState.RUNNING, LauncherState.BACKOFF):
            return False
        return node_place(wanted).local_world_size == len(self._workers)

    async def _supervise_in_place(self, rendezvous: Rendezvous, stopping: asyncio.Event) -> None:
        """In place: start every local rank; then a worker that fails is told to the node
        (`on_failure`, which asks for a new generation) and started again alone, waiting for a
        generation above the one it failed in (SHOAL_AFTER_GENERATION); a new generation handed
        over (`apply`) leaves the running workers alone, and kills those stopped (a hang: they
        cannot re-form) to start them in it. Giving up stops them all, as `_supervise` does."""
        slots = _Slots(asyncio.get_running_loop().time)
        for local_rank in range(node_place(rendezvous).local_world_size):
            proc = await self._start_slot(rendezvous, local_rank, None, slots.procs, stopping)
            if proc is None:
                return
            slots.procs.append(proc)
            slots.started_at.append(slots.now())
            slots.failures.append(0)
        self._show(slots.procs)
        self._state = LauncherState.RUNNING
        self._starts += 1
        try:
            while True:
                running = slots.running()
                exited = await next_exit(running, stopping, self._handed_over)
                if stopping.is_set():
                    await self._terminate(list(running.values()))
                    return
                current = self._current or rendezvous
                if self._handed_over.is_set():
                    self._handed_over.clear()
                    slots.retired |= kill_stopped(running.values(), current.generation)
                for index in exited:
                    if not await self._after_exit(slots, index, current, stopping):
                        return
        except asyncio.CancelledError:
            for proc in slots.procs:
                signal_group(proc, signal.SIGKILL)
            raise

    async def _after_exit(
        self, slots: _Slots, index: int, current: Rendezvous, stopping: asyncio.Event
    ) -> bool:
        """Worker `index` exited: started again (in the current generation when this
        supervisor killed it, else for the next one, after a backoff when it keeps failing),
        left alone when it finished, or the end of supervising (False: all finished, gave up,
        or stopping)."""
        proc, after = slots.procs[index], None
        code = proc.returncode
        if proc.pid in slots.retired:
            slots.retired.discard(proc.pid)
        elif code == 0 and not self._restart_on_success:
            slots.finished.add(index)
            if len(slots.finished) < len(slots.procs):
                return True
            log.info("generation %s: training command finished (exit 0)", current.generation)
            self._last_exit_code, self._state = 0, LauncherState.DONE
            return False
        else:
            self._last_exit_code = code
            self._last_error = (
                f"generation {current.generation}: training command exited {code} "
                f"(local rank {index}, pid {proc.pid})"
            )
            if code and self._on_failure is not None:
                self._on_failure(current.generation, self._last_error)
            if code and self._count_failure():
                await self._give_up(current.generation, slots.procs)
                return False
            delay_s = slots.backoff_s(
                index, self._healthy_after_s, self._backoff_s, self._max_backoff_s
            )
            log.warning(
                "%s; starting it again in %.1f s for the next generation", self._last_error, delay_s
            )
            if delay_s:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay_s):
                        await stopping.wait()
                if stopping.is_set():
                    await self._terminate([p for p in slots.procs if p.returncode is None])
                    return False
            self._restarts += 1
            after = current.generation
        others = [p for i, p in enumerate(slots.procs) if i != index]
        started = await self._start_slot(self._current or current, index, after, others, stopping)
        if started is None:
            return False
        slots.procs[index], slots.started_at[index] = started, slots.now()
        self._show(slots.procs)
        return True

    async def _start_slot(
        self,
        rendezvous: Rendezvous,
        local_rank: int,
        after: int | None,
        others: Sequence[asyncio.subprocess.Process],
        stopping: asyncio.Event,
    ) -> asyncio.subprocess.Process | None:
        """Start worker `local_rank` (in place), again after a backoff while it cannot start
        (each attempt a failure toward giving up); None once `stopping` is set or the launcher
        gave up (the `others` running are stopped then)."""
        attempts = 0
        while True:
            try:
                return await self._spawn(rendezvous, local_rank, after_generation=after)
            except OSError as exc:
                attempts += 1
                self._last_error = f"cannot start {self.command[0]}: {exc}"
                log.warning("generation %s: %s", rendezvous.generation, self._last_error)
                if self._count_failure():
                    await self._give_up(rendezvous.generation, others)
                    return None
                self._state = LauncherState.BACKOFF
                delay_s = restart_delay_s(attempts, self._backoff_s, self._max_backoff_s)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay_s):
                        await stopping.wait()
                if stopping.is_set():
                    await self._terminate([p for p in others if p.returncode is None])
                    return None

    def _show(self, procs: Sequence[asyncio.subprocess.Process]) -> None:
        """The workers `status` shows: each local rank's latest process, with its rank in the
        current generation."""
        current = self._current
        if current is None or current.rank is None:
            return
        place = node_place(current)
        self._workers = tuple((place.rank_of(i), proc) for i, proc in enumerate(procs))


async def next_exit(
    running: Mapping[int, asyncio.subprocess.Process],
    stopping: asyncio.Event,
    handed_over: asyncio.Event,
) -> list[int]:
    """Wait until a worker of `running` (by local rank) exits, `stopping` or `handed_over` is
    set: the local ranks that exited (possibly none)."""
    exits = {asyncio.ensure_future(proc.wait()): index for index, proc in running.items()}
    events = [asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(handed_over.wait())]
    try:
        await asyncio.wait({*exits, *events}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in (*exits, *events):
            future.cancel()
    return sorted(index for index, proc in running.items() if proc.returncode is not None)


def is_stopped(pid: int) -> bool:
    """True when process `pid` is stopped (SIGSTOP: state T in /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["T"]


def kill_stopped(procs: Iterable[asyncio.subprocess.Process], generation: int) -> set[int]:
    """SIGKILL every worker that is stopped (a hang: it cannot re-form); their pids."""
    killed: set[int] = set()
    for proc in procs:
        if proc.returncode is None and is_stopped(proc.pid):
            log.warning(
                "generation %s: worker pid %s is stopped (hung); starting it again",
                generation,
                proc.pid,
            )
            signal_group(proc, signal.SIGKILL)
            killed.add(proc.pid)
    return killed
