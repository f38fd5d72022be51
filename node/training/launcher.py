"""The training command of a node, run as torchrun runs it: one worker per local rank with
torchrun's environment, all of them restarted when one fails, restarted when the training group
changes, and stopped when this node has no rank. A command that keeps failing gives up and says
so, so the node can hand its rank on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from config import AsyncClosing
from health import CheckFn, CheckResult, HealthStatus
from node.errors import LauncherError
from node.training.in_place import InPlaceSupervision
from node.training.rendezvous import Rendezvous
from node.training.spares import SparePool, start_worker
from node.training.torchrun import ENV_AFTER_GENERATION, node_place, training_env
from node.training.workers import LauncherState, restart_delay_s, signal_group

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One worker of the current start: its local and global rank, its pid while it runs, and
    its exit code once it ended (negative: killed by that signal)."""

    local_rank: int
    rank: int
    pid: int | None
    exit_code: int | None


@dataclass(frozen=True, slots=True)
class LauncherStatus:
    """A snapshot for /status and health: the generation run, its workers and how they fared.
    `pid` is local rank 0's while it runs; `starts` counts starts of the node's workers (all
    local ranks at once) in this generation, `restarts` is the TORCHELASTIC_RESTART_COUNT of
    the current workers; `failures` counts the failed starts within the failure window."""

    state: LauncherState
    generation: int | None
    pid: int | None
    starts: int
    last_exit_code: int | None
    last_error: str | None
    failures: int = 0
    restarts: int = 0
    workers: tuple[WorkerStatus, ...] = ()


def worker_log_path(log_path: Path, local_rank: int) -> Path:
    """Where worker `local_rank` writes stdout and stderr: local rank 0 to `log_path`
    (training.log), local rank i to the same name with `.i` before the suffix (training.1.log)."""
    if local_rank == 0:
        return log_path
    return log_path.with_name(f"{log_path.stem}.{local_rank}{log_path.suffix}")


class TrainingLauncher(AsyncClosing, InPlaceSupervision):
    """Owns the node's training workers: one generation at a time, `local_world_size` workers
    (one per local rank, each in its own process group), with torchrun's environment.

    As with torchelastic, the workers start and stop together: when one fails (exit code != 0,
    or cannot start) the others are stopped and all are restarted after `restart_delay_s` while
    their generation is current, with TORCHELASTIC_RESTART_COUNT one higher; that counts as ONE
    failure. The backoff resets once the workers ran `healthy_after_s`. After `max_failures`
    failures within `failure_window_s` it gives up (state GAVE_UP) and calls
    `on_give_up(reason)`, and stays given up (also without a rank) until a new generation
    starts or `forgive()`. Each failure is told to `on_failure(generation, error)` first (the
    node asks the coordinator to restart the whole group). Workers that all exit 0 finished
    their work and are restarted only by a new generation (unless `restart_on_success`).
    Stopping sends SIGTERM to every worker's process group, then SIGKILL after
    `stop_timeout_s`. Worker i logs to
    `worker_log_path(log_path, i)`.
    """

    def __init__(
        self,
        command: Sequence[str],
        workdir: str | Path,
        log_path: str | Path,
        env: Mapping[str, str] | None = None,
        *,
        stop_timeout_s: float,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        healthy_after_s: float = 60.0,
        restart_on_success: bool = False,
        max_failures: int = 5,
        failure_window_s: float = 300.0,
        on_give_up: Callable[[str], None] | None = None,
        on_failure: Callable[[int, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        spares: SparePool | None = None,
        in_place: bool = False,
    ) -> None:
        if not command:
            raise LauncherError("the training command is empty")
        if max_failures < 1 or not failure_window_s > 0:
            raise LauncherError(
                f"max_failures ({max_failures}) must be >= 1 and failure_window_s "
                f"({failure_window_s}) > 0"
            )
        self.command = tuple(command)
        self.workdir = Path(workdir)
        self.log_path = Path(log_path)
        self._env = None if env is None else dict(env)
        self._stop_timeout_s = stop_timeout_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._healthy_after_s = healthy_after_s
        self._restart_on_success = restart_on_success
        self._max_failures = max_failures
        self._failure_window_s = failure_window_s
        self._on_give_up = on_give_up
        self._on_failure = on_failure
        self.spares = spares
        """Warm processes a worker starts in (node.training.spares), None: none."""
        self.in_place = in_place
        """training_reform: in_place: a new generation keeps the running workers (they re-form
        their group themselves, shoal.session.reform); a worker that exits starts again alone."""
        self._handed_over = asyncio.Event()
        """Set by `apply` when a new generation was handed to running workers (in place)."""
        self._clock = clock
        self._failed_at: deque[float] = deque()
        self._lock = asyncio.Lock()
        self._current: Rendezvous | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._workers: tuple[tuple[int, asyncio.subprocess.Process], ...] = ()
        """(global rank, process) per local rank of the current start."""
        self._state = LauncherState.IDLE
        self._starts = 0
        self._restarts = 0
        self._last_exit_code: int | None = None
        self._last_error: str | None = None

    @property
    def status(self) -> LauncherStatus:
        workers = tuple(
            WorkerStatus(
                local_rank,
                rank,
                proc.pid if proc.returncode is None else None,
                proc.returncode,
            )
            for local_rank, (rank, proc) in enumerate(self._workers)
        )
        return LauncherStatus(
            state=self._state,
            generation=None if self._current is None else self._current.generation,
            pid=workers[0].pid if workers else None,
            starts=self._starts,
            last_exit_code=self._last_exit_code,
            last_error=self._last_error,
            failures=len(self._failed_at),
            restarts=self._restarts,
            workers=workers,
        )

    async def apply(self, rendezvous: Rendezvous | None, *, keep_failures: bool = False) -> None:
        """Run the workers for `rendezvous`: the same group leaves them alone, a new group with
        a rank restarts them, no rank (or None) stops them. `keep_failures`: the new group is a
        restart of this one (its failures keep counting toward giving up)."""
        async with self._lock:
            if self._state is LauncherState.CLOSED:
                raise LauncherError("the launcher is closed")
            wanted = rendezvous if rendezvous is not None and rendezvous.rank is not None else None
            if wanted is not None and wanted.same_group(self._current):
                self._current = wanted
                return
            if wanted is not None and self._hands_over(wanted):
                log.info(
                    "generation %s: handed to the running workers (in place)", wanted.generation
                )
                self._current = wanted
                self._show([proc for _, proc in self._workers])
                self._handed_over.set()
                return
            await self._stop()
            self._current = wanted
            if wanted is None:
                return
            self._starts, self._restarts = 0, 0
            self._last_exit_code, self._last_error = None, None
            if not keep_failures:
                self._failed_at.clear()
            self._stopping = asyncio.Event()
            self._handed_over = asyncio.Event()
            supervise = self._supervise_in_place if self.in_place else self._supervise
            self._task = asyncio.create_task(
                supervise(wanted, self._stopping), name=f"training-gen{wanted.generation}"
            )

    def forgive(self) -> None:
        """Leave GAVE_UP for IDLE (the node offers itself for training again)."""
        if self._state is LauncherState.GAVE_UP:
            self._state = LauncherState.IDLE
            self._failed_at.clear()

    async def close(self) -> None:
        """Stop the workers; idempotent and final."""
        async with self._lock:
            self._state = LauncherState.CLOSED
            await self._stop()
            self._current = None
            self._state = LauncherState.CLOSED

    async def _stop(self) -> None:
        task = self._task
        if task is None:
            return
        self._stopping.set()
        # Shielded: if our caller is cancelled, the supervisor still finishes stopping the workers.
        await asyncio.shield(task)
        self._task = None
        self._workers = ()
        if self._state not in (LauncherState.CLOSED, LauncherState.GAVE_UP):
            self._state = LauncherState.IDLE

    async def _supervise(self, rendezvous: Rendezvous, stopping: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        generation, failures = rendezvous.generation, 0
        while not stopping.is_set():
            started = loop.time()
            exit_code = await self._run_once(rendezvous, stopping)
            if exit_code is None:
                return
            if exit_code == 0 and not self._restart_on_success:
                log.info("generation %s: training command finished (exit 0)", generation)
                self._state = LauncherState.DONE
                return
            if self._on_failure is not None:
                self._on_failure(generation, self._last_error or f"exit {exit_code}")
            if self._count_failure():
                reason = (
                    f"training command failed {len(self._failed_at)} times in "
                    f"{self._failure_window_s:.0f} s; last: {self._last_error}"
                )
                log.error("generation %s: giving up: %s", generation, reason)
                self._state, self._last_error = LauncherState.GAVE_UP, reason
                if self._on_give_up is not None:
                    self._on_give_up(reason)
                return
            failures = 1 if loop.time() - started >= self._healthy_after_s else failures + 1
            delay_s = restart_delay_s(failures, self._backoff_s, self._max_backoff_s)
            level = logging.WARNING if failures <= 3 else logging.DEBUG
            log.log(
                level,
                "generation %s: training command exited %s; restarting all workers in %.1f s",
                generation,
                exit_code,
                delay_s,
            )
            self._state = LauncherState.BACKOFF
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await stopping.wait()
            if not stopping.is_set():
                self._restarts += 1

    async def _give_up(self, generation: int, procs: Sequence[asyncio.subprocess.Process]) -> None:
        reason = (
            f"training command failed {len(self._failed_at)} times in "
            f"{self._failure_window_s:.0f} s; last: {self._last_error}"
        )
        log.error("generation %s: giving up: %s", generation, reason)
        await self._terminate([proc for proc in procs if proc.returncode is None])
        self._state, self._last_error = LauncherState.GAVE_UP, reason
        if self._on_give_up is not None:
            self._on_give_up(reason)

    def _count_failure(self) -> bool:
        """Record a failure now; True when `max_failures` fell within the window."""
        now = self._clock()
        self._failed_at.append(now)
        while self._failed_at and self._failed_at[0] <= now - self._failure_window_s:
            self._failed_at.popleft()
        return len(self._failed_at) >= self._max_failures

    async def _run_once(self, rendezvous: Rendezvous, stopping: asyncio.Event) -> int | None:
        """Start every worker and wait for them: 0 when all exited 0; the exit code of the first
        that failed (-1: one did not start), after stopping the others; None when `stopping`
        was set and the workers were stopped."""
        place = node_place(rendezvous)
        workers: list[tuple[int, asyncio.subprocess.Process]] = []
        try:
            for local_rank in range(place.local_world_size):
                proc = await self._spawn(rendezvous, local_rank)
                workers.append((place.rank_of(local_rank), proc))
        except OSError as exc:
            self._last_error = f"cannot start {self.command[0]}: {exc}"
            log.warning("generation %s: %s", rendezvous.generation, self._last_error)
            await self._terminate([proc for _, proc in workers])
            return -1
        except asyncio.CancelledError:
            for _, proc in workers:
                signal_group(proc, signal.SIGKILL)
            raise
        finally:
            self._workers = tuple(workers)
        procs = [proc for _, proc in workers]
        self._state = LauncherState.RUNNING
        self._starts += 1
        failed = await _first_failure(procs, stopping)
        if stopping.is_set():
            await self._terminate(procs)
            return None
        if failed is None:
            # Every worker exited by itself: kill what they may have left in their groups.
            for proc in procs:
                signal_group(proc, signal.SIGKILL)
            self._last_exit_code = 0
            return 0
        local_rank, exit_code = failed
        await self._terminate(procs)
        self._last_exit_code = exit_code
        self._last_error = (
            f"generation {rendezvous.generation}: training command exited {exit_code}"
        )
        if len(procs) > 1:
            self._last_error += f" (local rank {local_rank}, rank {workers[local_rank][0]})"
        return exit_code

    async def _spawn(
        self, rendezvous: Rendezvous, local_rank: int, *, after_generation: int | None = None
    ) -> asyncio.subprocess.Process:
        """Start worker `local_rank` of `rendezvous`; with `after_generation` (in place, a
        worker started again before the next generation exists) it asks the daemon for its
        rendezvous of a newer generation than that instead."""
        env = training_env(
            rendezvous,
            os.environ if self._env is None else self._env,
            local_rank=local_rank,
            restart_count=self._restarts,
            max_restarts=self._max_failures - 1,
        )
        if after_generation is not None:
            env[ENV_AFTER_GENERATION] = str(after_generation)
        header = (
            f"=== shoal: generation {rendezvous.generation} rank {env['RANK']}/"
            f"{rendezvous.world_size} local rank {local_rank}/{env['LOCAL_WORLD_SIZE']} "
            f"restart {self._restarts} master {rendezvous.master_addr}:"
            f"{rendezvous.master_port}: {' '.join(self.command)}\n"
        )
        path = worker_log_path(self.log_path, local_rank)
        log_file = await asyncio.to_thread(_open_log, path, header)
        try:
            proc = await start_worker(self.spares, self.command, env, self.workdir, log_file, path)
        finally:
            log_file.close()
        log.info(
            "generation %s: started training command as pid %s (rank %s of %s, local rank %s)",
            rendezvous.generation,
            proc.pid,
            env["RANK"],
            rendezvous.world_size,
            local_rank,
        )
        return proc

    async def _terminate(self, procs: Sequence[asyncio.subprocess.Process]) -> None:
        """SIGTERM every worker's process group (and SIGCONT: a stopped worker, a hang, takes
        the SIGTERM at once); SIGKILL them after stop_timeout_s."""
        for proc in procs:
            signal_group(proc, signal.SIGTERM)
            signal_group(proc, signal.SIGCONT)
        try:
            async with asyncio.timeout(self._stop_timeout_s):
                await asyncio.gather(*(proc.wait() for proc in procs))
        except TimeoutError:
            stubborn = [proc.pid for proc in procs if proc.returncode is None]
            log.warning(
                "training pid(s) %s ignored SIGTERM for %.1f s; killing them",
                stubborn,
                self._stop_timeout_s,
            )
            for proc in procs:
                signal_group(proc, signal.SIGKILL)
            await asyncio.gather(*(proc.wait() for proc in procs))
        if procs:
            self._last_exit_code = procs[0].returncode
        for proc in procs:
            signal_group(proc, signal.SIGKILL)


async def _first_failure(
    procs: list[asyncio.subprocess.Process], stopping: asyncio.Event
) -> tuple[int, int] | None:
    """Wait until a worker fails, all exit or `stopping` is set: (local rank, exit code) of the
    first that failed (the lowest local rank among those that failed together), else None.
    Cancelled: SIGKILL every worker's group, then re-raise."""
    exits = {asyncio.ensure_future(proc.wait()): local for local, proc in enumerate(procs)}
    stopped = asyncio.ensure_future(stopping.wait())
    failed: tuple[int, int] | None = None
    try:
        pending = set(exits)
        while pending and failed is None and not stopped.done():
            done, pending = await asyncio.wait(
                pending | {stopped}, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(stopped)
            failures = [(exits[f], f.result()) for f in done if f in exits and f.result()]
            failed = min(failures) if failures else None
    except asyncio.CancelledError:
        for proc in procs:
            signal_group(proc, signal.SIGKILL)
        raise
    finally:
        stopped.cancel()
        for future in exits:
            future.cancel()
    return failed


def _open_log(path: Path, header: str) -> BinaryIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    log_file = path.open("ab")
    log_file.write(header.encode())
    log_file.flush()
    return log_file


def launcher_check(launcher: TrainingLauncher) -> CheckFn:
    """The `training` health component: degraded, with the last error, while the training
    command fails (in backoff after a failure, or given up)."""

    async def check() -> CheckResult:
        status = launcher.status
        metrics = {"starts": float(status.starts), "failures": float(status.failures)}
        if status.state is LauncherState.GAVE_UP or (
            status.state is LauncherState.BACKOFF and status.failures > 0
        ):
            message = f"{status.state.value}: {status.last_error or 'no error recorded'}"
            return CheckResult(HealthStatus.DEGRADED, message, metrics)
        where = "" if status.generation is None else f", generation {status.generation}"
        return CheckResult(HealthStatus.HEALTHY, f"{status.state.value}{where}", metrics)

    return check
