"""Built-in checks: free disk space (and failed writes), WAL write latency and backlog, memory.

Each factory validates its thresholds and returns an async check function for HealthChecker.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from health.errors import HealthConfigError
from health.status import CheckFn, CheckResult, HealthStatus

__all__ = [
    "DiskWrites",
    "WalLike",
    "WalStatsLike",
    "WriteFailure",
    "disk_check",
    "disk_usage",
    "memory_check",
    "read_rss_bytes",
    "wal_backlog_check",
    "wal_check",
]

WAL_PROBE_KEY = "health.probe"
MIB = 1024 * 1024
SPACE_RETURNED_BYTES = 4 * MIB
"""A failed write is forgotten once its filesystem has this much more free space than then."""


@dataclass(frozen=True)
class WriteFailure:
    """A write to `path` failed with `message` while `free_bytes` were free (None: unknown)."""

    path: str
    message: str
    free_bytes: int | None
    at: float

    def describe(self) -> str:
        free = "unknown" if self.free_bytes is None else f"{self.free_bytes} bytes"
        return f"write to {self.path} failed ({free} free): {self.message}"


class DiskWrites:
    """The ledger of failed writes that stores report; the disk check stays unhealthy while it
    holds one, and listeners hear of each failure at once (not only at the next check)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._failures: dict[str, WriteFailure] = {}
        self._listeners: list[Callable[[WriteFailure], object]] = []

    def add_listener(self, listener: Callable[[WriteFailure], object]) -> None:
        """Call `listener(failure)` for every failed write from now on."""
        self._listeners.append(listener)

    def failed(self, path: str | os.PathLike[str], message: str, free_bytes: int | None) -> None:
        """A write to `path` failed; remembered until it succeeds or space returns."""
        failure = WriteFailure(str(path), message, free_bytes, self._clock())
        self._failures[failure.path] = failure
        for listener in list(self._listeners):
            listener(failure)

    def succeeded(self, path: str | os.PathLike[str]) -> None:
        """A write to `path` succeeded: forget its failure."""
        self._failures.pop(str(path), None)

    @property
    def failures(self) -> tuple[WriteFailure, ...]:
        return tuple(self._failures.values())

    def forget_where_space_returned(self, free_now: Callable[[str], int | None]) -> None:
        """Forget failures whose filesystem now has SPACE_RETURNED_BYTES more free than then."""
        for failure in self.failures:
            now = free_now(failure.path)
            if failure.free_bytes is None or now is None:
                continue
            if now >= failure.free_bytes + SPACE_RETURNED_BYTES:
                self._failures.pop(failure.path, None)


class WalStatsLike(Protocol):
    """The part of `wal.WalStats` the backlog check reads."""

    @property
    def pending(self) -> int: ...

    @property
    def oldest_pending_age_s(self) -> float | None: ...


class WalLike(Protocol):
    """The part of `wal.WriteAheadLog` the checks use."""

    async def stats(self) -> WalStatsLike: ...

    async def state_set(self, key: str, value: Any) -> object: ...


def _grade(value: float, degraded: float | None, unhealthy: float | None) -> HealthStatus:
    if unhealthy is not None and value >= unhealthy:
        return HealthStatus.UNHEALTHY
    if degraded is not None and value >= degraded:
        return HealthStatus.DEGRADED
    return HealthStatus.HEALTHY


def _worst(*statuses: HealthStatus) -> HealthStatus:
    return max(statuses, key=lambda status: status.severity)


def _require_order(what: str, degraded: float | None, unhealthy: float | None) -> None:
    for value in (degraded, unhealthy):
        if value is not None and value < 0:
            raise HealthConfigError(f"{what} thresholds must not be negative, got {value}")
    if degraded is not None and unhealthy is not None and degraded > unhealthy:
        raise HealthConfigError(
            f"{what}: the degraded threshold ({degraded}) must not exceed "
            f"the unhealthy threshold ({unhealthy})"
        )


def disk_usage(path: str | os.PathLike[str]) -> tuple[int, int, float]:
    """(total_bytes, free_bytes, used_pct) of the filesystem holding `path`, as `df` counts them:
    free is what an unprivileged process may still use."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = used + free
    used_pct = 100.0 * used / usable if usable > 0 else 0.0
    return total, free, used_pct


def _free_bytes(path: str) -> int | None:
    for candidate in (Path(path), *Path(path).parents):
        try:
            return disk_usage(candidate)[1]
        except OSError:
            continue
    return None


def disk_check(
    path: str | os.PathLike[str],
    degraded_pct: float = 80.0,
    unhealthy_pct: float = 90.0,
    writes: DiskWrites | None = None,
) -> CheckFn:
    """Degraded when the filesystem of `path` is `degraded_pct` % full, unhealthy at
    `unhealthy_pct` %; unreadable is unhealthy; so is a failed write in `writes` until that
    path is written again or its filesystem has SPACE_RETURNED_BYTES more free."""
    _require_order("disk_check", degraded_pct, unhealthy_pct)
    where = Path(path)

    async def check() -> CheckResult:
        try:
            total, free, used_pct = await asyncio.to_thread(disk_usage, where)
        except OSError as exc:
            return CheckResult(HealthStatus.UNHEALTHY, f"cannot read free space of {where}: {exc}")
        if writes is not None:
            writes.forget_where_space_returned(_free_bytes)
            if writes.failures:
                failure = writes.failures[-1]
                metrics = {"free_bytes": free, "total_bytes": total, "failed_writes": 1.0}
                return CheckResult(HealthStatus.UNHEALTHY, failure.describe(), metrics)
        status = _grade(used_pct, degraded_pct, unhealthy_pct)
        message = f"{where}: {used_pct:.1f}% used, {free / MIB:.1f} MiB free"
        if status is HealthStatus.UNHEALTHY:
            message += f" (unhealthy from {unhealthy_pct:g}%)"
        elif status is HealthStatus.DEGRADED:
            message += f" (degraded from {degraded_pct:g}%)"
        metrics = {"used_pct": round(used_pct, 2), "free_bytes": free, "total_bytes": total}
        return CheckResult(status, message, metrics)

    return check


def wal_check(
    wal: WalLike, slow_write_s: float = 0.5, unhealthy_write_s: float | None = None
) -> CheckFn:
    """A durable write of key "health.probe": degraded at `slow_write_s` or slower, unhealthy at
    `unhealthy_write_s`. A WAL that raises or hangs is unhealthy through HealthChecker."""
    _require_order("wal_check", slow_write_s, unhealthy_write_s)

    async def check() -> CheckResult:
        start = time.perf_counter()
        await wal.state_set(WAL_PROBE_KEY, time.time())
        write_s = time.perf_counter() - start
        status = _grade(write_s, slow_write_s, unhealthy_write_s)
        message = f"durable write took {write_s * 1000:.1f} ms"
        if status is not HealthStatus.HEALTHY:
            message += f" (slow from {slow_write_s * 1000:.0f} ms)"
        return CheckResult(status, message, {"write_s": write_s})

    return check


def wal_backlog_check(
    wal: WalLike,
    degraded_pending: int = 10_000,
    unhealthy_pending: int = 50_000,
    degraded_age_s: float = 600.0,
    unhealthy_age_s: float = 3600.0,
) -> CheckFn:
    """Grades the count of pending WAL entries and the age of the oldest; the worse one wins."""
    _require_order("wal_backlog_check pending", degraded_pending, unhealthy_pending)
    _require_order("wal_backlog_check age", degraded_age_s, unhealthy_age_s)

    async def check() -> CheckResult:
        stats = await wal.stats()
        age_s = stats.oldest_pending_age_s
        by_count = _grade(stats.pending, degraded_pending, unhealthy_pending)
        by_age = (
            HealthStatus.HEALTHY
            if age_s is None
            else _grade(age_s, degraded_age_s, unhealthy_age_s)
        )
        message = f"{stats.pending} pending entries"
        if age_s is not None:
            message += f", oldest {age_s:.0f} s old"
        if by_count is not HealthStatus.HEALTHY:
            limit = _limit(by_count, degraded_pending, unhealthy_pending)
            message += f" (count {by_count.value} from {limit:g})"
        if by_age is not HealthStatus.HEALTHY:
            limit = _limit(by_age, degraded_age_s, unhealthy_age_s)
            message += f" (age {by_age.value} from {limit:g} s)"
        metrics: dict[str, float] = {"pending": stats.pending}
        if age_s is not None:
            metrics["oldest_pending_age_s"] = age_s
        return CheckResult(_worst(by_count, by_age), message, metrics)

    return check


def _limit(status: HealthStatus, degraded: float, unhealthy: float) -> float:
    return unhealthy if status is HealthStatus.UNHEALTHY else degraded


def read_rss_bytes(status_path: str | os.PathLike[str] = "/proc/self/status") -> int | None:
    """Resident set size of this process from /proc, or None where /proc has no VmRSS."""
    try:
        text = Path(status_path).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                unit = fields[2].lower() if len(fields) > 2 else "kb"
                return int(fields[1]) * (1024 if unit == "kb" else 1)
    return None


def memory_check(
    degraded_rss_mb: float = 2048.0,
    unhealthy_rss_mb: float = 4096.0,
    status_path: str | os.PathLike[str] = "/proc/self/status",
) -> CheckFn:
    """Grades this process's RSS; not applicable where /proc/self/status is unreadable."""
    _require_order("memory_check", degraded_rss_mb, unhealthy_rss_mb)

    async def check() -> CheckResult:
        rss = read_rss_bytes(status_path)
        if rss is None:
            return CheckResult(HealthStatus.NOT_APPLICABLE, f"no VmRSS in {status_path}")
        rss_mb = rss / MIB
        status = _grade(rss_mb, degraded_rss_mb, unhealthy_rss_mb)
        message = f"resident memory {rss_mb:.0f} MiB"
        if status is not HealthStatus.HEALTHY:
            limit = unhealthy_rss_mb if status is HealthStatus.UNHEALTHY else degraded_rss_mb
            message += f" ({status.value} from {limit:g} MiB)"
        return CheckResult(status, message, {"rss_mb": round(rss_mb, 1)})

    return check
