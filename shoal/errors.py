"""The errors of the public package: one base, ShoalError, and what a training process sees
when it speaks to its local daemon or forms its training group.

    ShoalError
    ├── DaemonUnreachableError    no answer from the daemon (not running, refused, timed out)
    ├── DaemonAnswerError         the daemon answered with an error (status, code, reason)
    ├── GroupError                the training group did not form in time, or was aborted
    ├── SessionError              a background thread of the session failed (the cause chained)
    └── CheckpointError           a checkpoint could not be saved or restored (which, and why)
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "DaemonAnswerError",
    "DaemonUnreachableError",
    "GroupError",
    "SessionError",
    "ShoalError",
]


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


class GroupError(ShoalError):
    """The training group of this process could not be formed (no rank in time, the master
    unreachable, torch missing) or was aborted; the message names the generation and why."""


class SessionError(ShoalError):
    """A background thread of the training session failed (reporting, an async save): raised at
    the next `report()` or `save()` with the failure as its `__cause__`."""


class CheckpointError(ShoalError):
    """A checkpoint could not be saved or restored: the message names the step, the directory
    and what failed."""
