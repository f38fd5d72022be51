"""The job context (fray's `JobContext`): put/get/run/wait and actors, the same for every
backend; refs, actor handles, the errors, and how a task's outcome travels (cloudpickle, with the
remote traceback of a failure)."""

from __future__ import annotations

import concurrent.futures as cf
import secrets
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import cloudpickle

from node.errors import (
    RemoteTaskError,
    RemoteTraceback,
    TaskTimeout,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Ref:
    """An object put into a context: its id and who holds it."""

    id: str
    owner: str = ""


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class Outcome:
    """What a task produced: its value, or the error with the traceback text where it ran."""

    ok: bool
    value: Any = None
    error: BaseException | None = None
    traceback_text: str = ""
    error_type: str = ""


def run_captured(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, object]) -> Outcome:
    """Call fn and capture its result or its exception (with the traceback text)."""
    try:
        return Outcome(True, fn(*args, **kwargs))
    except Exception as exc:  # a task's failure is its result
        text = "".join(traceback.format_exception(exc))
        return Outcome(False, None, exc, text, f"{type(exc).__module__}.{type(exc).__qualname__}")


def dump_outcome(outcome: Outcome) -> bytes:
    """cloudpickle of the outcome; an exception that cannot be pickled travels as text."""
    try:
        return bytes(cloudpickle.dumps(outcome))
    except Exception as exc:
        if outcome.ok:
            text = "".join(traceback.format_exception(exc))
            lost = Outcome(False, None, None, text, f"{type(exc).__qualname__}")
            return bytes(cloudpickle.dumps(lost))
        stripped = Outcome(False, None, None, outcome.traceback_text, outcome.error_type)
        return bytes(cloudpickle.dumps(stripped))


def unwrap(outcome: Outcome) -> Any:
    """The value, or the task's own exception re-raised with its remote traceback as cause."""
    if outcome.ok:
        return outcome.value
    cause = RemoteTraceback(outcome.traceback_text)
    if outcome.error is not None:
        raise outcome.error.with_traceback(None) from cause
    raise RemoteTaskError(f"task failed with {outcome.error_type}") from cause


def settle(future: cf.Future[Any], outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)


def result_of(future: cf.Future[Any], timeout_s: float | None) -> Any:
    """The value of a future holding an Outcome (its error re-raised), waiting `timeout_s`."""
    try:
        outcome = future.result(timeout=timeout_s)
    except cf.TimeoutError as exc:
        raise TaskTimeout(f"the task did not finish within {timeout_s} s") from exc
    if isinstance(outcome, Outcome):
        return unwrap(outcome)
    return outcome


def wait_futures(
    futures: Sequence[cf.Future[Any]], num_returns: int, timeout_s: float | None
) -> tuple[list[cf.Future[Any]], list[cf.Future[Any]]]:
    """(ready, pending) as Ray's wait: at most `num_returns` ready ones in the given order,
    returning once that many are done or `timeout_s` has passed."""
    if num_returns < 0 or num_returns > len(futures):
        raise ValueError(f"num_returns {num_returns} is not within 0..{len(futures)}")
    done: set[cf.Future[Any]] = {f for f in futures if f.done()}
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while len(done) < num_returns:
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            break
        step = cf.wait(set(futures) - done, timeout=left, return_when=cf.FIRST_COMPLETED)
        done |= step.done
    ready = [f for f in futures if f in done][: max(num_returns, 0)]
    chosen = set(ready)
    return ready, [f for f in futures if f not in chosen]


class ActorMethod:
    """`handle.method`; `.remote(*args, **kwargs)` calls it and returns a future."""

    def __init__(self, handle: ActorHandle, name: str) -> None:
        self._handle = handle
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle._call(self._name, args, kwargs)


class ActorHandle:
    """A handle on an actor; every backend implements `_call`. `handle.method.remote(...)`."""

    name: str | None = None
    incarnation: int = 0

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, object]) -> Any:
        raise NotImplementedError

    def __getattr__(self, method: str) -> ActorMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return ActorMethod(self, method)


@runtime_checkable
class JobContext(Protocol):
    """What code running inside a job uses, whichever backend runs it."""

    def put(self, obj: Any) -> Any: ...

    def get(self, ref: Any, timeout_s: float | None = None) -> Any: ...

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def wait(
        self, futures: Sequence[Any], num_returns: int = 1, timeout_s: float | None = None
    ) -> tuple[list[Any], list[Any]]: ...

    def create_actor(
        self,
        cls: type[Any],
        *args: Any,
        name: str | None = None,
        get_if_exists: bool = False,
        **kwargs: Any,
    ) -> ActorHandle: ...

    def close(self) -> None: ...
