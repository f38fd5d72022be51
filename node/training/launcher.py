"""The training command of a node that is not elastic-aware: started with the rendezvous in its
environment, restarted when the training group changes, and stopped when this node has no rank.
A command that keeps failing gives up and says so, so the node can hand its rank on.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
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
from node.errors import LauncherError as LauncherError
from node.training.rendezvous import Rendezvous

log = logging.getLogger(__name__)


class LauncherState(enum.StrEnum):
    """What the launcher's child is doing."""

    IDLE = "idle"
    RUNNING = "running"
    BACKOFF = "backoff"
    DONE = "done"
    GAVE_UP = "gave_up"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class LauncherStatus:
    """A snapshot for /status and health: the generation run, its child and how it fared.
    `failures` counts the failed starts within the failure window."""

    state: LauncherState
    generation: int | None
    pid: int | None
    starts: int
    last_exit_code: int | None
    last_error: str | None
    failures: int = 0


def training_env(rendezvous: Rendezvous, base_env: Mapping[str, str]) -> dict[str, str]:
    """`base_env` plus what torch.distributed's env:// init and shoal-aware code read."""
    if rendezvous.rank is None:
        raise LauncherError(f"generation {rendezvous.generation} gives this node no rank")
    return {
        **base_env,
        "MASTER_ADDR": rendezvous.master_addr,
        "MASTER_PORT": str(rendezvous.master_port),
        "RANK": str(rendezvous.rank),
        "WORLD_SIZE": str(rendezvous.world_size),
        "LOCAL_RANK": "0",
        "SHOAL_GENERATION": str(rendezvous.generation),
    }


def restart_delay_s(failures: int, backoff_s: float, max_backoff_s: float) -> float:
    """The wait before restart number `failures` (1, 2, ...): doubling from `backoff_s`."""
    return min(max_backoff_s, backoff_s * 2.0 ** max(0, failures - 1))


class TrainingLauncher(AsyncClosing):
    """Owns the training child process: one generation at a time, in its own process group.

    A child that fails (exit code != 0, or cannot start) is restarted after `restart_delay_s`
    while its generation is current; the backoff resets once a child ran `healthy_after_s`.
    After `max_failures` failures within `failure_window_s` it gives up (state GAVE_UP) and calls
    `on_give_up(reason)`, and stays given up (also without a rank) until a new generation
    starts or `forgive()`. A child that exits 0 finished its
    work and is restarted only by a new generation (unless `restart_on_success`). Stopping sends
    SIGTERM to the process group, then SIGKILL after `stop_timeout_s`.
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
        clock: Callable[[], float] = time.monotonic,
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
        self._clock = clock
        self._failed_at: deque[float] = deque()
        self._lock = asyncio.Lock()
        self._current: Rendezvous | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._state = LauncherState.IDLE
        self._starts = 0
        self._last_exit_code: int | None = None
        self._last_error: str | None = None

    @property
    def status(self) -> LauncherStatus:
        proc = self._proc
        running = proc is not None and proc.returncode is None
        return LauncherStatus(
            state=self._state,
            generation=None if self._current is None else self._current.generation,
            pid=proc.pid if proc is not None and running else None,
            starts=self._starts,
            last_exit_code=self._last_exit_code,
            last_error=self._last_error,
            failures=len(self._failed_at),
        )

    async def apply(self, rendezvous: Rendezvous | None) -> None:
        """Run the child for `rendezvous`: the same group leaves it alone, a new group with a
        rank restarts it, no rank (or None) stops it."""
        async with self._lock:
            if self._state is LauncherState.CLOSED:
                raise LauncherError("the launcher is closed")
            wanted = rendezvous if rendezvous is not None and rendezvous.rank is not None else None
            if wanted is not None and wanted.same_group(self._current):
                self._current = wanted
                return
            await self._stop()
            self._current = wanted
            if wanted is None:
                return
            self._starts, self._last_exit_code, self._last_error = 0, None, None
            self._failed_at.clear()
            self._stopping = asyncio.Event()
            self._task = asyncio.create_task(
                self._supervise(wanted, self._stopping), name=f"training-gen{wanted.generation}"
            )

    def forgive(self) -> None:
        """Leave GAVE_UP for IDLE (the node offers itself for training again)."""
        if self._state is LauncherState.GAVE_UP:
            self._state = LauncherState.IDLE
            self._failed_at.clear()

    async def close(self) -> None:
        """Stop the child; idempotent and final."""
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
        # Shielded: if our caller is cancelled, the supervisor still finishes stopping the child.
        await asyncio.shield(task)
        self._task = None
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
            if exit_code != -1:
                self._last_error = f"generation {generation}: training command exited {exit_code}"
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
                "generation %s: training command exited %s; restart in %.1f s",
                generation,
                exit_code,
                delay_s,
            )
            self._state = LauncherState.BACKOFF
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await stopping.wait()

    def _count_failure(self) -> bool:
        """Record a failure now; True when `max_failures` fell within the window."""
        now = self._clock()
        self._failed_at.append(now)
        while self._failed_at and self._failed_at[0] <= now - self._failure_window_s:
            self._failed_at.popleft()
        return len(self._failed_at) >= self._max_failures

    async def _run_once(self, rendezvous: Rendezvous, stopping: asyncio.Event) -> int | None:
        """Start one child and wait for it: its exit code (-1: did not start), or None when
        `stopping` was set and the child was stopped."""
        try:
            proc = await self._spawn(rendezvous)
        except OSError as exc:
            self._last_error = f"cannot start {self.command[0]}: {exc}"
            log.warning("generation %s: %s", rendezvous.generation, self._last_error)
            return -1
        self._proc, self._state = proc, LauncherState.RUNNING
        self._starts += 1
        exited = asyncio.ensure_future(proc.wait())
        stopped = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({exited, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            _signal_group(proc, signal.SIGKILL)
            raise
        finally:
            stopped.cancel()
        if not exited.done():
            await self._terminate(proc)
            exited.cancel()
            return None
        _signal_group(proc, signal.SIGKILL)  # stragglers of a child that exited by itself
        self._last_exit_code = exited.result()
        return self._last_exit_code

    async def _spawn(self, rendezvous: Rendezvous) -> asyncio.subprocess.Process:
        env = training_env(rendezvous, os.environ if self._env is None else self._env)
        header = (
            f"=== shoal: generation {rendezvous.generation} rank {rendezvous.rank}/"
            f"{rendezvous.world_size} master {rendezvous.master_addr}:{rendezvous.master_port}: "
            f"{' '.join(self.command)}\n"
        )
        log_file = await asyncio.to_thread(_open_log, self.log_path, header)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                cwd=self.workdir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log_file.close()
        log.info(
            "generation %s: started training command as pid %s (rank %s of %s)",
            rendezvous.generation,
            proc.pid,
            rendezvous.rank,
            rendezvous.world_size,
        )
        return proc

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM the child's process group; SIGKILL it after stop_timeout_s."""
        _signal_group(proc, signal.SIGTERM)
        try:
            async with asyncio.timeout(self._stop_timeout_s):
                await proc.wait()
        except TimeoutError:
            log.warning(
                "training pid %s ignored SIGTERM for %.1f s; killing it",
                proc.pid,
                self._stop_timeout_s,
            )
            _signal_group(proc, signal.SIGKILL)
            await proc.wait()
        self._last_exit_code = proc.returncode
        _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: asyncio.subprocess.Process, signum: signal.Signals) -> None:
    """Signal the child's process group (it leads its own session); gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


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
