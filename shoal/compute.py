"""A rank's own compute time in a step, measured without the script's help: the time between
two `report()` calls less the time the rank spent blocked in collectives, where waiting for a
slower peer shows. Collectives are timed by wrapping torch.distributed's blocking calls while a
session is open, and DDP's gradient all-reduce by a communication hook (`watch_ddp`), which
counts only the part not overlapped with the backward pass.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["COLLECTIVES", "CollectiveClock"]

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
)
"""The blocking collectives of torch.distributed that are timed (an `async_op=True` call is
not: its wait happens elsewhere)."""
_ORIGINAL = "__shoal_original__"


class CollectiveClock:
    """Seconds this process spent blocked in collectives, read with `take()`. `install()` wraps
    torch.distributed's collectives (once per process: a second clock leaves them alone);
    `uninstall()` puts the originals back."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._blocked_s = 0.0
        self._ready_at = 0.0
        self._done_at = 0.0
        self._installed: list[tuple[Any, str, Any]] = []

    def add(self, seconds: float) -> None:
        with self._lock:
            self._blocked_s += seconds

    def take(self) -> float:
        """Seconds blocked since the last take (DDP's exposed all-reduce included)."""
        with self._lock:
            exposed = max(0.0, self._done_at - self._ready_at) if self._ready_at else 0.0
            blocked, self._blocked_s = self._blocked_s + exposed, 0.0
            self._ready_at = self._done_at = 0.0
        return blocked

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` counting the seconds of each blocking call."""
        clock, add = self._clock, self.add

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("async_op"):
                return fn(*args, **kwargs)
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                add(clock() - start)

        setattr(call, _ORIGINAL, fn)
        return call

    def install(self, dist: Any) -> None:
        """Wrap the COLLECTIVES of `dist` (torch.distributed) and of its distributed_c10d."""
        modules = [dist, getattr(dist, "distributed_c10d", None)]
        for module in (m for m in modules if m is not None):
            for name in COLLECTIVES:
                fn = getattr(module, name, None)
                if fn is None or hasattr(fn, _ORIGINAL):
                    continue
                wrapped = self.timed(fn)
                setattr(module, name, wrapped)
                self._installed.append((module, name, wrapped))

    def uninstall(self) -> None:
        """Put back what `install` wrapped (where nobody replaced it since)."""
        for module, name, wrapped in reversed(self._installed):
            if getattr(module, name, None) is wrapped:
                setattr(module, name, getattr(wrapped, _ORIGINAL))
        self._installed.clear()

    def bucket_ready(self) -> None:
        with self._lock:
            self._ready_at = max(self._ready_at, self._clock())

    def bucket_done(self) -> None:
        with self._lock:
            self._done_at = max(self._done_at, self._clock())

    def ddp_hook(self) -> Callable[[Any, Any], Any]:
        """A DDP communication hook: the default all-reduce, timed. The exposed wait of a step
        is from the last bucket ready (the backward pass ended) to the last all-reduce done.
        (A lambda: DDP refuses a hook whose annotations are not its own types.)"""
        return lambda process_group, bucket: self._all_reduce(process_group, bucket)

    def _all_reduce(self, process_group: Any, bucket: Any) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.bucket_ready()
        future = default_hooks.allreduce_hook(process_group, bucket)

        def done(fut: Any) -> Any:
            self.bucket_done()
            return fut.value()

        return future.then(done)
