"""Auto-stop: a node stops (or releases) itself through its provider once idle for a window.

Idle means, at every check over the whole window: no running job, no run lock held, and every
GPU below `gpu_util_threshold` percent (NVML). A check that fails counts as busy, so a node
never stops on a guess, and never while any job runs. Each action is audited in the WAL
(entry type `node.autostop`, committed when done, failed with the error otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

from config import HostEntry
from node.errors import ProviderError
from node.providers.base import ActionResult, NodeHandle, Provider
from wal import WalError, WriteAheadLog

logger = logging.getLogger(__name__)

WAL_ENTRY_TYPE = "node.autostop"
DEFAULT_CHECK_INTERVAL_S = 30.0


@dataclass(frozen=True)
class AutostopPolicy:
    """When and how a node stops itself."""

    idle_s: float
    action: Literal["stop", "release"] = "stop"
    gpu_util_threshold: float = 5.0
    check_interval_s: float = DEFAULT_CHECK_INTERVAL_S

    @classmethod
    def of_host(
        cls, entry: HostEntry, check_interval_s: float = DEFAULT_CHECK_INTERVAL_S
    ) -> AutostopPolicy | None:
        """The policy of an inventory host's `autostop:` section, None without one."""
        section = entry.autostop
        if section is None:
            return None
        return cls(
            section.idle_minutes * 60.0,
            section.action,
            section.gpu_util_threshold,
            check_interval_s,
        )


@dataclass(frozen=True)
class IdleSample:
    """One check: when (monotonic seconds), whether the node was idle, and why not."""

    at: float
    idle: bool
    reason: str = ""


@dataclass(frozen=True)
class IdleChecks:
    """The seams of the idle check: running jobs, the run lock, GPU utilisation (percent)."""

    running_jobs: Callable[[], Awaitable[int]]
    run_lock_held: Callable[[], Awaitable[bool]]
    gpu_utilization: Callable[[], Sequence[float]]


def idle_streak_start(samples: Sequence[IdleSample]) -> float | None:
    """When the trailing run of idle samples began (None if the newest is busy or none)."""
    start = None
    for sample in reversed(samples):
        if not sample.idle:
            break
        start = sample.at
    return start


def should_act(samples: Sequence[IdleSample], now: float, policy: AutostopPolicy) -> bool:
    """True when every sample of at least the last `idle_s` seconds was idle."""
    start = idle_streak_start(samples)
    return start is not None and now - start >= policy.idle_s


async def take_sample(checks: IdleChecks, threshold: float, now: float) -> IdleSample:
    """One idle check; any check that raises makes the sample busy with its error."""
    try:
        jobs = await checks.running_jobs()
    except Exception as exc:
        return IdleSample(now, False, f"job check failed: {exc}")
    if jobs > 0:
        return IdleSample(now, False, f"{jobs} job(s) running")
    try:
        locked = await checks.run_lock_held()
    except Exception as exc:
        return IdleSample(now, False, f"run lock check failed: {exc}")
    if locked:
        return IdleSample(now, False, "a run lock is held")
    try:
        utilization = list(checks.gpu_utilization())
    except Exception as exc:
        return IdleSample(now, False, f"GPU check failed: {exc}")
    busy = [u for u in utilization if u >= threshold]
    if busy:
        return IdleSample(now, False, f"GPU busy ({max(busy):g}% >= {threshold:g}%)")
    return IdleSample(now, True)


def nvml_utilization() -> list[float]:
    """GPU utilisation in percent per device from NVML; [] on a host without an NVIDIA driver.
    Other NVML errors raise (and so count as busy)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        missing = (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if getattr(exc, "value", None) in missing:
            return []
        raise
    try:
        return [
            float(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i)).gpu)
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


class AutoStop:
    """Checks idleness every `policy.check_interval_s` and, once idle for the window, runs the
    provider's stop or release on `handle` (or, with `dry_run`, only audits that it would).
    Owns its loop task (async context manager; close() idempotent). Acts at most once."""

    def __init__(
        self,
        provider: Provider,
        handle: NodeHandle,
        policy: AutostopPolicy,
        checks: IdleChecks,
        *,
        wal: WriteAheadLog | None = None,
        dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.provider = provider
        self.handle = handle
        self.policy = policy
        self.checks = checks
        self.wal = wal
        self.dry_run = dry_run
        self.clock = clock
        self.samples: list[IdleSample] = []
        self.acted: dict[str, Any] | None = None
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def start(self) -> None:
        """Start the check loop (once)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"autostop-{self.handle.id}")

    async def close(self) -> None:
        """Stop the check loop; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while self.acted is None:
            try:
                await self.check_once()
            except (ProviderError, WalError, OSError) as exc:
                self.last_error = str(exc)
                logger.warning("autostop %s: %s", self.handle.id, exc)
            await asyncio.sleep(self.policy.check_interval_s)

    async def check_once(self) -> dict[str, Any] | None:
        """Take one sample and act when the window is idle; the action's record, else None."""
        if self.acted is not None:
            return None
        now = self.clock()
        sample = await take_sample(self.checks, self.policy.gpu_util_threshold, now)
        self.samples.append(sample)
        horizon = now - self.policy.idle_s - 2 * self.policy.check_interval_s
        self.samples = [s for s in self.samples if s.at >= horizon] or [sample]
        if not should_act(self.samples, now, self.policy):
            return None
        return await self._act(now)

    async def _act(self, now: float) -> dict[str, Any]:
        start = idle_streak_start(self.samples) or now
        record: dict[str, Any] = {
            "provider": self.handle.provider,
            "node": self.handle.id,
            "action": self.policy.action,
            "idle_s": round(now - start, 3),
            "dry_run": self.dry_run,
        }
        entry = await self.wal.append(WAL_ENTRY_TYPE, record) if self.wal else None
        try:
            if self.dry_run:
                outcome = f"dry run: would {self.policy.action} {self.handle.id}"
            elif self.policy.action == "release":
                await self.provider.release(self.handle)
                outcome = "released"
            else:
                result: ActionResult = await self.provider.stop(self.handle)
                outcome = result.message or ("stopped" if result.changed else "no change")
        except ProviderError as exc:
            if self.wal is not None and entry is not None:
                await self.wal.fail(entry, error=str(exc))
            raise
        if self.wal is not None and entry is not None:
            await self.wal.commit(entry)
        logger.warning("autostop %s: idle %.0fs: %s", self.handle.id, now - start, outcome)
        self.acted = {**record, "outcome": outcome}
        return self.acted

    def status(self) -> dict[str, Any]:
        """For /status and the monitor: idle time so far, last busy reason, what was done."""
        now = self.clock()
        start = idle_streak_start(self.samples)
        busy = next((s.reason for s in reversed(self.samples) if not s.idle), None)
        return {
            "action": self.policy.action,
            "idle_window_s": self.policy.idle_s,
            "idle_for_s": 0.0 if start is None else round(now - start, 3),
            "last_busy_reason": busy,
            "dry_run": self.dry_run,
            "acted": self.acted,
            "last_error": self.last_error,
        }
