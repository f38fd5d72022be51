"""Auto-stop: a node stops (or releases) itself through its provider once idle for a window.

Idle means, at every check over the whole window: no running job, no run lock held, and every
GPU below `gpu_util_threshold` percent (NVML). A check that fails counts as busy, so a node
never stops on a guess, and never while any job runs. Each decision is a WAL entry
`node.autostop` appended before acting (committed when done, rolled back when the provider
refused); one still pending at start-up was interrupted and is reported, never repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from config import HostEntry
from config.closing import AsyncClosing
from health import LoopHealth
from node.providers.base import ActionResult, NodeHandle, Provider
from node.providers.decision import AutostopDecision
from node.providers.static import NO_OP
from node.runtime import AutostopStatusJson
from wal import WriteAheadLog

logger = logging.getLogger(__name__)

WAL_ENTRY_TYPE = "node.autostop"
LAST_DECISION_KEY = "autostop.last_decision"
"""WAL state key of the newest decision (shown in /v1/status across restarts)."""
DEFAULT_CHECK_INTERVAL_S = 30.0
CLOSE_GRACE_S = 10.0
"""How long close() lets a decision in progress finish its audit before cancelling it."""


class AutostopSectionLike(Protocol):
    """The fields of an `autostop:` section (node settings or an inventory host)."""

    @property
    def idle_minutes(self) -> float: ...
    @property
    def action(self) -> Literal["stop", "release"]: ...
    @property
    def gpu_util_threshold(self) -> float: ...


@dataclass(frozen=True)
class AutostopPolicy:
    """When and how a node stops itself."""

    idle_s: float
    action: Literal["stop", "release"] = "stop"
    gpu_util_threshold: float = 5.0
    check_interval_s: float = DEFAULT_CHECK_INTERVAL_S

    @classmethod
    def of_section(
        cls, section: AutostopSectionLike, check_interval_s: float | None = None
    ) -> AutostopPolicy:
        """The policy of an `autostop:` section; the check interval defaults to a tenth of the
        window, at most DEFAULT_CHECK_INTERVAL_S."""
        idle_s = section.idle_minutes * 60.0
        interval = check_interval_s or min(DEFAULT_CHECK_INTERVAL_S, idle_s / 10.0)
        return cls(idle_s, section.action, section.gpu_util_threshold, interval)

    @classmethod
    def of_host(
        cls, entry: HostEntry, check_interval_s: float = DEFAULT_CHECK_INTERVAL_S
    ) -> AutostopPolicy | None:
        """The policy of an inventory host's `autostop:` section, None without one."""
        if entry.autostop is None:
            return None
        return cls.of_section(entry.autostop, check_interval_s)


@dataclass(frozen=True)
class IdleSample:
    """One check: when (monotonic seconds), whether the node was idle, and why not."""

    at: float
    idle: bool
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class IdleChecks:
    """The seams of the idle check: running jobs, the run locks this node holds (names), and
    each GPU's utilisation in percent (None: that GPU could not be read)."""

    running_jobs: Callable[[], Awaitable[int]]
    run_locks_held: Callable[[], Awaitable[Sequence[str]]]
    gpu_utilization: Callable[[], Awaitable[Sequence[float | None]]]


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
    """One idle check of all three seams; each busy finding or failed check is a reason."""
    reasons: list[str] = []
    try:
        jobs = await checks.running_jobs()
    except Exception as exc:
        reasons.append(f"job check failed: {exc}")
    else:
        if jobs > 0:
            reasons.append("job running" if jobs == 1 else f"{jobs} jobs running")
    try:
        locks = list(await checks.run_locks_held())
    except Exception as exc:
        reasons.append(f"run lock check failed: {exc}")
    else:
        if locks:
            reasons.append(f"run lock held: {', '.join(locks)}")
    try:
        utilization = list(await checks.gpu_utilization())
    except Exception as exc:
        reasons.append(f"gpu read failed: {exc}")
    else:
        for index, util in enumerate(utilization):
            if util is None:
                reasons.append(f"gpu {index} read failed")
            elif util >= threshold:
                reasons.append(f"gpu {index} at {util:g}%")
    return IdleSample(now, not reasons, tuple(reasons))


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


async def recover_interrupted(wal: WriteAheadLog) -> list[AutostopDecision]:
    """Resolve the `node.autostop` entries still pending: decisions whose action was never
    confirmed because the daemon went down during it (as stopping this very node does). Each
    is committed without acting again, kept as the last decision and returned, so a restarted
    node reports it and needs a whole new idle window before it decides again. A payload that
    is not a decision is committed and left out (logged, naming the field)."""
    found = []
    for entry in await wal.pending(WAL_ENTRY_TYPE):
        try:
            record = AutostopDecision.from_json(entry.payload)
        except ValueError as exc:
            await wal.commit(entry.id)
            logger.error("autostop: WAL entry %d is not a decision: %s", entry.id, exc)
            continue
        decision = replace(
            record,
            entry=entry.id,
            decided_at=entry.created_at if record.decided_at is None else record.decided_at,
            recovered=True,
            outcome=(
                f"interrupted: the daemon went down during this {record.action or 'stop'} and "
                "restarted; not repeated (a new decision needs a whole idle window)"
            ),
        )
        await wal.state_set(LAST_DECISION_KEY, decision.to_json())
        await wal.commit(entry.id)
        logger.warning("autostop: WAL entry %d: %s", entry.id, decision.outcome)
        found.append(decision)
    return found


class AutoStop(AsyncClosing):
    """Checks idleness every `policy.check_interval_s` and, once idle for the window, runs the
    provider's stop or release on `handle` (with `dry_run`, only logs and audits that it would,
    then watches a new window). Owns its loop task (async context manager; close() idempotent).
    Acts for real at most once."""

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
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.provider = provider
        self.handle = handle
        self.policy = policy
        self.checks = checks
        self.wal = wal
        self.dry_run = dry_run
        self.clock = clock
        self.wall_clock = wall_clock
        self.samples: list[IdleSample] = []
        self.acted: AutostopDecision | None = None
        self.last_decision: AutostopDecision | None = None
        self.last_error: str | None = None
        self.loop_health = LoopHealth("autostop")
        self._acting = False
        self._task: asyncio.Task[None] | None = None

    async def _enter(self) -> None:
        self.start()

    async def load(self) -> None:
        """Read the last decision kept in the WAL (after a restart)."""
        if self.wal is not None:
            stored = await self.wal.state_get(LAST_DECISION_KEY)
            if stored is not None:
                try:
                    self.last_decision = AutostopDecision.from_json(stored)
                except ValueError as exc:
                    logger.warning("autostop: the kept last decision is unreadable: %s", exc)

    def start(self) -> None:
        """Start the check loop (once)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"autostop-{self.handle.id}")

    async def close(self) -> None:
        """Stop the check loop, letting a decision in progress finish its audit first (up to
        CLOSE_GRACE_S); idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        if self._acting:
            await asyncio.wait({task}, timeout=CLOSE_GRACE_S)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _loop(self) -> None:
        while self.acted is None:
            try:
                await self.check_once()
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.loop_health.record_failure(exc)
                logger.warning("autostop %s: %s", self.handle.id, self.last_error)
            else:
                self.loop_health.record_success(self._note())
            await asyncio.sleep(self.policy.check_interval_s)

    def _note(self) -> str:
        latest = self.samples[-1] if self.samples else None
        if self.acted is not None:
            return f"acted: {self.acted.outcome}"
        if latest is None or latest.idle:
            return f"idle {self.idle_for_s():.0f} s of {self.policy.idle_s:g} s"
        return "busy: " + "; ".join(latest.reasons)

    def idle_for_s(self) -> float:
        """Seconds the node has been idle at every check so far (0 while busy)."""
        start = idle_streak_start(self.samples)
        return 0.0 if start is None else max(0.0, self.clock() - start)

    async def check_once(self) -> AutostopDecision | None:
        """Take one sample and act when the window is idle; the decision, else None."""
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

    async def _act(self, now: float) -> AutostopDecision:
        start = idle_streak_start(self.samples) or now
        action = self.policy.action
        record = AutostopDecision(
            provider=self.handle.provider,
            node=self.handle.id,
            action=action,
            idle_s=round(now - start, 3),
            window_s=self.policy.idle_s,
            dry_run=self.dry_run,
            decided_at=round(self.wall_clock(), 3),
        )
        self._acting = True
        try:
            entry = await self.wal.append(WAL_ENTRY_TYPE, record.payload()) if self.wal else None
            self.last_decision = replace(record, entry=entry)
            try:
                outcome = await self._run_action()
            except Exception as exc:
                self.samples = []  # the next attempt needs a whole new window
                await self._decided(replace(record, entry=entry, outcome=f"failed: {exc}"))
                if self.wal is not None and entry is not None:
                    await self.wal.rollback(entry, reason=f"{action} failed: {exc}")
                raise
            decision = replace(record, entry=entry, outcome=outcome)
            await self._decided(decision)
            if self.wal is not None and entry is not None:
                await self.wal.commit(entry)
        finally:
            self._acting = False
        logger.warning("autostop %s: idle %.0f s: %s", self.handle.id, now - start, outcome)
        if self.dry_run:
            self.samples = []  # audit again only after another whole window
        else:
            self.acted = decision
        return decision

    async def _run_action(self) -> str:
        action = self.policy.action
        if self.dry_run:
            return f"dry run: would {action} {self.handle.provider}/{self.handle.id}"
        if action == "release":
            await self.provider.release(self.handle)
            return NO_OP if self.provider.name == "static" else "released"
        result: ActionResult = await self.provider.stop(self.handle)
        return result.message or ("stopped" if result.changed else "no change")

    async def _decided(self, decision: AutostopDecision) -> None:
        self.last_decision = decision
        if self.wal is not None:
            await self.wal.state_set(LAST_DECISION_KEY, decision.to_json())

    def state(self) -> str:
        """`acted`, `acting`, `idle`, `busy`, or `starting` before the first check."""
        if self.acted is not None:
            return "acted"
        if self._acting:
            return "acting"
        if not self.samples:
            return "starting"
        return "idle" if self.samples[-1].idle else "busy"

    def status(self) -> AutostopStatusJson:
        """The `autostop` object of /v1/status (the monitor reads it)."""
        idle_for = self.idle_for_s()
        start = idle_streak_start(self.samples)
        latest = self.samples[-1] if self.samples else None
        return {
            "enabled": True,
            "state": self.state(),
            "provider": self.handle.provider,
            "action": self.policy.action,
            "dry_run": self.dry_run,
            "window_s": self.policy.idle_s,
            "check_interval_s": self.policy.check_interval_s,
            "gpu_util_threshold": self.policy.gpu_util_threshold,
            "idle_since": None if start is None else round(self.wall_clock() - idle_for, 3),
            "idle_for_s": round(idle_for, 3),
            "busy_reasons": [] if latest is None else list(latest.reasons),
            "last_decision": None if self.last_decision is None else self.last_decision.to_json(),
            "last_error": self.last_error,
        }


def disabled_status(last_decision: AutostopDecision | None = None) -> AutostopStatusJson:
    """The `autostop` object of a node without an `autostop:` section."""
    shown = None if last_decision is None else last_decision.to_json()
    return {"enabled": False, "state": "off", "last_decision": shown}


def starting_status(last_decision: AutostopDecision | None = None) -> AutostopStatusJson:
    """The `autostop` object of a node with an `autostop:` section whose auto-stop has not
    started yet (no policy, sample or busy reason to show)."""
    shown = None if last_decision is None else last_decision.to_json()
    return {"enabled": True, "state": "starting", "last_decision": shown}


__all__ = [
    "LAST_DECISION_KEY",
    "WAL_ENTRY_TYPE",
    "AutoStop",
    "AutostopPolicy",
    "IdleChecks",
    "IdleSample",
    "disabled_status",
    "idle_streak_start",
    "nvml_utilization",
    "recover_interrupted",
    "should_act",
    "starting_status",
    "take_sample",
]
