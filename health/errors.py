"""Exceptions of health: HealthError is the base of all; CircuitOpenError (a breaker refused
a call) and HealthConfigError (also a ValueError: a threshold or breaker config is invalid)."""

from __future__ import annotations

__all__ = ["CircuitOpenError", "HealthConfigError", "HealthError"]


class HealthError(Exception):
    """Base of every error the health package raises."""


class HealthConfigError(HealthError, ValueError):
    """A breaker config, threshold or check registration is invalid; the message names it."""


class CircuitOpenError(HealthError):
    """The breaker `name` refuses calls; retry in `retry_after_s` seconds."""

    def __init__(self, name: str, retry_after_s: float, reason: str = "open") -> None:
        self.name = name
        self.retry_after_s = max(0.0, retry_after_s)
        self.reason = reason
        super().__init__(
            f"circuit {name!r} is {reason}; calls are refused, retry in {self.retry_after_s:.1f} s"
        )

    def __reduce__(self) -> tuple[type[CircuitOpenError], tuple[str, float, str]]:
        return (type(self), (self.name, self.retry_after_s, self.reason))
