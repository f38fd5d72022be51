"""LoopHealth: a background loop reports each round (torchft's `report_error`), and its health
check shows a loop that keeps failing as degraded with the last error, not only a log line.
"""

from __future__ import annotations

import time

from health.breaker_config import Clock
from health.errors import HealthConfigError
from health.status import CheckResult, HealthStatus

__all__ = ["LoopHealth"]


class LoopHealth:
    """The latest rounds of one background loop (sync, election, discovery, training).

    `check` is a health check (`HealthChecker.add_check(name, loop.check)`): degraded once
    `failures_to_degrade` rounds in a row failed, naming the last error and when it happened;
    healthy after a round succeeds. The owner of the loop calls `record_success()` or
    `record_failure(error)` once per round; both are cheap and never raise.
    """

    def __init__(
        self, name: str, *, failures_to_degrade: int = 2, wall_clock: Clock = time.time
    ) -> None:
        if failures_to_degrade < 1:
            raise HealthConfigError(
                f"loop {name!r}: failures_to_degrade must be at least 1, got {failures_to_degrade}"
            )
        self.name = name
        self.failures_to_degrade = failures_to_degrade
        self._wall_clock = wall_clock
        self.rounds = 0
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_success_at: float | None = None
        self._note = ""

    def record_success(self, note: str = "") -> None:
        """One round worked; `note` says what it did (shown while healthy)."""
        self.rounds += 1
        self.consecutive_failures = 0
        self.last_success_at = self._wall_clock()
        self._note = note

    def record_failure(self, error: BaseException | str) -> None:
        """One round failed with `error` (an exception or a line of text)."""
        self.rounds += 1
        self.consecutive_failures += 1
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        self.last_error = error
        self.last_error_at = self._wall_clock()

    @property
    def failing(self) -> bool:
        """True once `failures_to_degrade` rounds in a row failed."""
        return self.consecutive_failures >= self.failures_to_degrade

    def result(self) -> CheckResult:
        """The loop's health now (what `check` answers)."""
        metrics = {
            "rounds": float(self.rounds),
            "consecutive_failures": float(self.consecutive_failures),
        }
        if self.failing:
            assert self.last_error_at is not None
            ago = max(0.0, self._wall_clock() - self.last_error_at)
            message = (
                f"{self.name} loop failed {self.consecutive_failures} rounds in a row; "
                f"last error {ago:.0f} s ago: {self.last_error}"
            )
            return CheckResult(HealthStatus.DEGRADED, message, metrics)
        if self.rounds == 0:
            return CheckResult(HealthStatus.HEALTHY, f"{self.name} loop has not run a round yet")
        return CheckResult(HealthStatus.HEALTHY, self._note or f"{self.name} loop running", metrics)

    async def check(self) -> CheckResult:
        return self.result()
