"""The errors of the public package: one base, ShoalError, and what a training process sees
when it speaks to its local daemon.

    ShoalError
    ├── DaemonUnreachableError    no answer from the daemon (not running, refused, timed out)
    ├── DaemonAnswerError         the daemon answered with an error (status, code, reason)
    └── CheckpointError           a checkpoint could not be saved or restored (which, and why)
"""

from __future__ import annotations

__all__ = ["CheckpointError", "DaemonAnswerError", "DaemonUnreachableError", "ShoalError"]


class ShoalError(Exception):
    """Base of every error the `shoal` package raises."""


class DaemonUnreachableError(ShoalError):
    """The local daemon did not answer: `url` and why."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the shoal daemon at {url} is unreachable: {reason}")
        self.url = url
        self.reason = reason


class DaemonAnswerError(ShoalError):
    """The local daemon answered `status` with the wire error shape (`code`, `reason`)."""

    def __init__(self, url: str, status: int, code: str, reason: str) -> None:
        super().__init__(f"{url} answered {status} {code}: {reason}")
        self.url = url
        self.status = status
        self.code = code
        self.reason = reason


class CheckpointError(ShoalError):
    """A checkpoint could not be saved or restored: the message names the step, the directory
    and what failed."""
