"""What the training launcher's supervisors share (node.training.launcher, node.training.in_place):
the launcher's state, the backoff between restarts, and signalling a worker's process group."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal

__all__ = ["LauncherState", "restart_delay_s", "signal_group"]


class LauncherState(enum.StrEnum):
    """What the launcher's workers are doing."""

    IDLE = "idle"
    RUNNING = "running"
    BACKOFF = "backoff"
    DONE = "done"
    GAVE_UP = "gave_up"
    CLOSED = "closed"


def restart_delay_s(failures: int, backoff_s: float, max_backoff_s: float) -> float:
    """The wait before restart number `failures` (1, 2, ...): doubling from `backoff_s`."""
    return min(max_backoff_s, backoff_s * 2.0 ** max(0, failures - 1))


def signal_group(proc: asyncio.subprocess.Process, signum: signal.Signals) -> None:
    """Signal the worker's process group (it leads its own session); gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)
