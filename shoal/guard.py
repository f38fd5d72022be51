"""Collectives that give way when the training group changes. While a session re-forms in
place, the blocking collectives its training thread calls run as asynchronous operations whose
wait wakes when the operation ends and every `poll_s` to ask whether to give up: the operation
failed (a peer died: its connection closed), the session has a newer group to move to, or the
operation outlasted the collective timeout (a peer stopped answering). `GroupChanged` is raised
instead, and the loop re-forms its group (`TrainingSession.reform`).

An operation given up on is left to the old group, which the session then destroys: gloo
cannot abort a pending operation (it fails on its own once its peers left), NCCL's
communicator is aborted. Calls from other threads (an asynchronous checkpoint's) and calls that
ask for `async_op` themselves pass through untouched.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from shoal.errors import ShoalError

__all__ = ["GUARDED", "CollectiveGuard", "GroupChanged"]

GUARDED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
)
"""The blocking collectives of torch.distributed that take `async_op` (the `*_object` ones do
not, and pass through)."""
_WRAPPED = "__shoal_guarded__"


class GroupChanged(ShoalError):
    """The training group changed under a collective (a peer left or stopped answering, or a
    newer group is ready): re-form the group in place (`session.reform(state, step)`) and redo
    the step. `reason` says what happened."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the training group changed: {reason}")
        self.reason = reason


class CollectiveGuard:
    """Runs the training thread's blocking collectives so they give way (module docstring).
    `give_way()` returns why to give up now (None: go on); it is asked before each collective
    and every `poll_s` while one runs. `timeout_s` bounds each collective."""

    def __init__(
        self,
        timeout_s: float,
        give_way: Callable[[], str | None],
        *,
        poll_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self._give_way = give_way
        self._poll_s = poll_s
        self._clock = clock
        self._thread: int | None = None
        self._installed: list[tuple[Any, str, Any]] = []
        self.last_change: GroupChanged | None = None
        """The last GroupChanged this guard raised."""

    def install(self, dist: Any) -> None:
        """Guard the GUARDED collectives of `dist` (torch.distributed) and its distributed_c10d
        for calls from the current thread (the training loop's)."""
        self._thread = threading.get_ident()
        modules = [dist, getattr(dist, "distributed_c10d", None)]
        for module in (m for m in modules if m is not None):
            for name in GUARDED:
                fn = getattr(module, name, None)
                if fn is None or hasattr(fn, _WRAPPED):
                    continue
                wrapped = self.guarded(fn, name)
                setattr(module, name, wrapped)
                self._installed.append((module, name, wrapped))

    def uninstall(self) -> None:
        """Put back what `install` wrapped (where nobody replaced it since)."""
        for module, name, wrapped in reversed(self._installed):
            if getattr(module, name, None) is wrapped:
                setattr(module, name, getattr(wrapped, _WRAPPED))
        self._installed.clear()

    def guarded(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        """`fn` (a collective taking `async_op`) giving way in the training thread."""

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("async_op") or threading.get_ident() != self._thread:
                return fn(*args, **kwargs)
            self.check()
            try:
                work = fn(*args, **{**kwargs, "async_op": True})
            except RuntimeError as exc:  # DistBackendError is one: the group is broken
                raise self._changed(f"{name} failed: {_first_line(exc)}") from exc
            if work is not None:  # None: this rank is not in the group it was called on
                self.wait(work, name)
            return None

        setattr(call, _WRAPPED, fn)
        return call

    def check(self) -> None:
        """Raise GroupChanged when `give_way` says so."""
        reason = self._give_way()
        if reason is not None:
            raise self._changed(reason)

    def wait(self, work: Any, name: str) -> None:
        """Wait for `work` (a torch.distributed Work): return when it succeeded; GroupChanged
        when it failed, when `give_way` says so, or after `timeout_s`."""
        done = threading.Event()
        work.get_future().add_done_callback(lambda _: done.set())
        deadline = self._clock() + self.timeout_s
        while not done.wait(self._poll_s):
            self.check()
            if self._clock() >= deadline:
                raise self._changed(f"{name} did not finish within {self.timeout_s:g} s")
        try:
            work.wait()
        except RuntimeError as exc:
            raise self._changed(f"{name} failed: {_first_line(exc)}") from exc

    def _changed(self, reason: str) -> GroupChanged:
        self.last_change = GroupChanged(reason)
        return self.last_change


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
