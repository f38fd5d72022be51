"""What a circuit breaker is told (BreakerConfig) and what it shows (CircuitState, BreakerSnapshot),
and which errors count against a peer."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from config.timeouts import Timeouts
from health.errors import HealthConfigError

__all__ = [
    "BreakerConfig",
    "BreakerSnapshot",
    "CircuitState",
    "Clock",
    "StateListener",
    "counts_as_failure",
]

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
StateListener = Callable[[str, "CircuitState", "CircuitState"], None]


class CircuitState(enum.StrEnum):
    """CLOSED lets calls through, OPEN refuses them, HALF_OPEN admits a few probe calls."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    """How a breaker counts failures and backs off. Times in seconds of the breaker's clock.

    `excluded` exceptions and those for which `is_failure(exc)` is False are the peer answering
    "no" (auth errors, 4xx): they count as successes. CancelledError never counts.
    """

    failure_threshold: int = 5
    recovery_timeout_s: float = 60.0
    half_open_requests: int = 1
    max_backoff_s: float = 600.0
    decay_after_s: float = 300.0
    probe_timeout_s: float = 30.0
    excluded: tuple[type[BaseException], ...] = ()
    is_failure: Callable[[BaseException], bool] | None = None

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise HealthConfigError(
                f"failure_threshold must be at least 1, got {self.failure_threshold}"
            )
        if self.half_open_requests < 1:
            raise HealthConfigError(
                f"half_open_requests must be at least 1, got {self.half_open_requests}"
            )
        for field_name in ("recovery_timeout_s", "decay_after_s", "probe_timeout_s"):
            value = getattr(self, field_name)
            if not value > 0:
                raise HealthConfigError(f"{field_name} must be positive, got {value}")
        if self.max_backoff_s < self.recovery_timeout_s:
            raise HealthConfigError(
                f"max_backoff_s ({self.max_backoff_s}) must not be below "
                f"recovery_timeout_s ({self.recovery_timeout_s})"
            )

    @classmethod
    def from_timeouts(cls, timeouts: Timeouts, failure_threshold: int = 5) -> BreakerConfig:
        """The config whose recovery and probe times come from the node's timeout table."""
        return cls(
            failure_threshold=failure_threshold,
            recovery_timeout_s=timeouts.breaker_recovery_s,
            probe_timeout_s=timeouts.breaker_probe_s,
            max_backoff_s=max(600.0, timeouts.breaker_recovery_s),
        )


@dataclass(frozen=True)
class BreakerSnapshot:
    """One breaker's state at one moment, for /v1/status and the dashboard.

    `opened_at` is a reading of the breaker's clock; `retry_after_s` is None while CLOSED.
    """

    name: str
    peer: str
    transport: str
    state: CircuitState
    consecutive_failures: int
    opened_at: float | None
    retry_after_s: float | None
    current_recovery_s: float
    total_failures: int
    total_successes: int


def counts_as_failure(config: BreakerConfig, exc: BaseException) -> bool:
    """Whether `exc` leaving a guarded call counts against the peer."""
    if not isinstance(exc, Exception):
        return False  # CancelledError, KeyboardInterrupt, SystemExit: not the peer's fault
    if config.excluded and isinstance(exc, config.excluded):
        return False
    if config.is_failure is None:
        return True
    try:
        return config.is_failure(exc)
    except Exception:
        logger.warning("is_failure predicate raised on %r; counting it as a failure", exc)
        return True
