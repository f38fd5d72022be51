"""Polling helpers: wait until a condition holds, or fail with what was last seen."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["WaitTimeoutError", "async_wait_until", "wait_until"]


class WaitTimeoutError(AssertionError):
    """A condition polled by `wait_until` did not hold in time (a test failure, not an error)."""


def _describe(predicate: Callable[[], object], message: str | None) -> str:
    if message:
        return message
    name = getattr(predicate, "__qualname__", None) or repr(predicate)
    return f"{name}()"


def _timeout_error(
    what: str, timeout_s: float, attempts: int, last_value: object, last_exc: BaseException | None
) -> WaitTimeoutError:
    detail = (
        f"last raised {last_exc!r}" if last_exc is not None else f"last returned {last_value!r}"
    )
    return WaitTimeoutError(
        f"timed out after {timeout_s:g}s waiting for {what} ({attempts} attempts; {detail})"
    )


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
    *,
    message: str | None = None,
    retry_on: tuple[type[Exception], ...] = (OSError,),
) -> T:
    """Call `predicate` every `interval_s` until it returns a truthy value, and return that value.

    Exceptions of the `retry_on` types count as "not yet"; any other exception propagates.
    Raises `WaitTimeoutError` after `timeout_s`, naming `message` (or the predicate), the attempt
    count and the last value or exception. The predicate is always tried at least once.
    """
    deadline = time.monotonic() + timeout_s
    attempts = 0
    last_value: object = None
    last_exc: BaseException | None = None
    while True:
        attempts += 1
        try:
            value = predicate()
        except retry_on as exc:
            last_exc = exc
        else:
            if value:
                return value
            last_value, last_exc = value, None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            what = _describe(predicate, message)
            raise _timeout_error(what, timeout_s, attempts, last_value, last_exc) from last_exc
        time.sleep(min(interval_s, remaining))


async def async_wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
    *,
    message: str | None = None,
    retry_on: tuple[type[Exception], ...] = (OSError,),
) -> T:
    """Async `wait_until`: `predicate` may be a plain or an async callable.

    One call of an async predicate is cancelled when the overall deadline passes, so a hung
    probe cannot outlive `timeout_s`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    attempts = 0
    last_value: object = None
    last_exc: BaseException | None = None
    while True:
        attempts += 1
        try:
            result = predicate()
            if inspect.isawaitable(result):
                async with asyncio.timeout_at(deadline):
                    value: T = await result
            else:
                value = result
        except TimeoutError as exc:
            if loop.time() < deadline and not isinstance(exc, retry_on):
                raise
            last_exc = exc
        except retry_on as exc:
            last_exc = exc
        else:
            if value:
                return value
            last_value, last_exc = value, None
        remaining = deadline - loop.time()
        if remaining <= 0:
            what = _describe(predicate, message)
            raise _timeout_error(what, timeout_s, attempts, last_value, last_exc) from last_exc
        await asyncio.sleep(min(interval_s, remaining))
