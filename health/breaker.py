"""Circuit breaker guarding the calls to one peer over one transport (its settings and states
are in breaker_config.py).

A single-threaded asyncio state machine: every state change happens between awaits, so no lock.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from health.breaker_config import (
    BreakerConfig,
    BreakerSnapshot,
    CircuitState,
    Clock,
    StateListener,
    counts_as_failure,
)
from health.errors import CircuitOpenError, HealthError

__all__ = ["CircuitBreaker"]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class _Ticket:
    """An admitted call: the epoch (state generation) it was admitted in, its probe slot if any."""

    epoch: int
    probe_id: int | None


# Admitted calls of the current task, innermost last: (id(breaker), ticket). Immutable tuples, so
# a task spawned inside `async with breaker:` never sees or pops its parent's ticket.
_TICKETS: ContextVar[tuple[tuple[int, _Ticket], ...]] = ContextVar("health_breaker_tickets")


class CircuitBreaker:
    """Guards calls to one peer: `async with breaker:` or `@breaker` on an async function.

    Raises CircuitOpenError instead of running the call while OPEN, or while HALF_OPEN with all
    probe slots taken. Time-based transitions happen lazily, when the breaker is next used or read.
    """

    def __init__(
        self,
        name: str,
        config: BreakerConfig | None = None,
        *,
        clock: Clock = time.monotonic,
        peer: str | None = None,
        transport: str = "",
    ) -> None:
        self.name = name
        self.peer = peer if peer is not None else name
        self.transport = transport
        self._config = config if config is not None else BreakerConfig()
        self._clock = clock
        self._listeners: list[StateListener] = []
        self._state = CircuitState.CLOSED
        self._epoch = 0
        self._consecutive_failures = 0
        self._opened_at: float | None = None
        self._recovery_s = self._config.recovery_timeout_s
        self._healthy_since = clock()
        self._closed_at: float | None = None  # None: never opened yet
        self._loud = False  # whether the current open episode was logged at WARNING
        self._probes: dict[int, float] = {}  # probe id -> admission time
        self._next_probe_id = 0
        self._probe_successes = 0
        self._total_failures = 0
        self._total_successes = 0

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.name!r} {self._state.value}>"

    @property
    def config(self) -> BreakerConfig:
        return self._config

    @property
    def state(self) -> CircuitState:
        """The current state, after applying any transition that time has made due."""
        self._advance(self._clock())
        return self._state

    def add_listener(self, listener: StateListener) -> None:
        """Call `listener(name, old, new)` on every state change; its errors are logged only."""
        self._listeners.append(listener)

    def remove_listener(self, listener: StateListener) -> None:
        self._listeners.remove(listener)

    def reconfigure(self, config: BreakerConfig) -> None:
        """Use `config` from now on, keeping the state; the backoff is clamped to its bounds."""
        self._config = config
        self._recovery_s = min(
            max(self._recovery_s, config.recovery_timeout_s), config.max_backoff_s
        )

    def reset(self) -> None:
        """Back to CLOSED with the base recovery time; calls in flight no longer count."""
        now = self._clock()
        self._recovery_s = self._config.recovery_timeout_s
        if self._state is CircuitState.CLOSED:
            self._epoch += 1
            self._consecutive_failures = 0
            self._healthy_since = now
        else:
            self._transition(CircuitState.CLOSED, now, reason="reset")

    def trip(self, reason: str) -> None:
        """Open now, whatever the count of failures: the peer did something no retry excuses
        (it served bytes that do not match their hash). Calls in flight no longer count."""
        now = self._clock()
        self._advance(now)
        self._total_failures += 1
        if self._state is CircuitState.OPEN:
            return
        self._trip(now, reason=reason, backoff=self._state is CircuitState.HALF_OPEN)

    def snapshot(self) -> BreakerSnapshot:
        now = self._clock()
        self._advance(now)
        retry_after: float | None = None
        if self._state is CircuitState.OPEN:
            retry_after = max(0.0, self._reopen_at() - now)
        elif self._state is CircuitState.HALF_OPEN:
            retry_after = 0.0
        return BreakerSnapshot(
            name=self.name,
            peer=self.peer,
            transport=self.transport,
            state=self._state,
            consecutive_failures=self._consecutive_failures,
            opened_at=self._opened_at,
            retry_after_s=retry_after,
            current_recovery_s=self._recovery_s,
            total_failures=self._total_failures,
            total_successes=self._total_successes,
        )

    async def __aenter__(self) -> CircuitBreaker:
        ticket = self._admit()
        _TICKETS.set((*_TICKETS.get(()), (id(self), ticket)))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack = _TICKETS.get(())
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == id(self):
                ticket = stack[i][1]
                _TICKETS.set(stack[:i] + stack[i + 1 :])
                break
        else:
            raise HealthError(f"circuit {self.name!r} exited without a matching enter")
        self._complete(ticket, exc)

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """Decorate an async function so that every call goes through this breaker."""

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            async with self:
                return await fn(*args, **kwargs)

        return guarded

    def _reopen_at(self) -> float:
        assert self._opened_at is not None
        return self._opened_at + self._recovery_s

    def _admit(self) -> _Ticket:
        now = self._clock()
        self._advance(now)
        if self._state is CircuitState.CLOSED:
            return _Ticket(self._epoch, None)
        if self._state is CircuitState.OPEN:
            raise CircuitOpenError(self.name, self._reopen_at() - now)
        if len(self._probes) >= self._config.half_open_requests:
            free_at = min(self._probes.values()) + self._config.probe_timeout_s
            raise CircuitOpenError(
                self.name,
                free_at - now,
                reason=f"half-open with all {self._config.half_open_requests} probe slots busy",
            )
        probe_id = self._next_probe_id
        self._next_probe_id += 1
        self._probes[probe_id] = now
        return _Ticket(self._epoch, probe_id)

    def _complete(self, ticket: _Ticket, exc: BaseException | None) -> None:
        now = self._clock()
        self._advance(now)
        current = ticket.epoch == self._epoch
        if exc is not None and not isinstance(exc, Exception):
            if current and ticket.probe_id is not None:
                self._probes.pop(ticket.probe_id, None)  # cancelled: frees the slot, no verdict
            return
        if exc is None or not counts_as_failure(self._config, exc):
            self._total_successes += 1
            if current:
                self._on_success(ticket, now)
            return
        self._total_failures += 1
        if not current:
            return  # admitted before the last transition: its verdict is stale
        if self._state is CircuitState.HALF_OPEN:
            self._trip(now, reason=f"probe failed: {exc!r}", backoff=True)
            return
        self._consecutive_failures += 1
        if self._consecutive_failures >= self._config.failure_threshold:
            self._trip(now, reason=f"last error: {exc!r}", backoff=False)

    def _on_success(self, ticket: _Ticket, now: float) -> None:
        if self._state is CircuitState.CLOSED:
            self._consecutive_failures = 0
        elif self._state is CircuitState.HALF_OPEN and ticket.probe_id is not None:
            if self._probes.pop(ticket.probe_id, None) is None:
                return
            self._probe_successes += 1
            if self._probe_successes >= self._config.half_open_requests:
                self._transition(CircuitState.CLOSED, now, reason="probes succeeded")

    def _advance(self, now: float) -> None:
        """Apply the transitions that time alone makes: decay, OPEN->HALF_OPEN, probe timeouts."""
        for _ in range(4):  # at most OPEN -> HALF_OPEN -> OPEN (probe expired) -> HALF_OPEN
            if self._state is CircuitState.CLOSED:
                self._decay(now)
                return
            if self._state is CircuitState.OPEN:
                if now < self._reopen_at():
                    return
                self._transition(CircuitState.HALF_OPEN, self._reopen_at(), reason="recovery due")
                continue
            if not self._probes:
                return
            expired_at = min(self._probes.values()) + self._config.probe_timeout_s
            if now < expired_at:
                return
            self._total_failures += 1
            self._trip(expired_at, reason="a probe never reported", backoff=True)

    def _decay(self, now: float) -> None:
        """Halve the backoff once per healthy period of `decay_after_s` spent CLOSED."""
        base = self._config.recovery_timeout_s
        period = self._config.decay_after_s
        while self._recovery_s > base and now - self._healthy_since >= period:
            self._recovery_s = max(base, self._recovery_s / 2)
            self._healthy_since += period

    def _trip(self, at: float, *, reason: str, backoff: bool) -> None:
        if backoff:
            self._recovery_s = min(self._recovery_s * 2, self._config.max_backoff_s)
        self._transition(CircuitState.OPEN, at, reason=reason)

    def _transition(self, new: CircuitState, at: float, *, reason: str) -> None:
        old = self._state
        failures = self._consecutive_failures
        self._state = new
        self._epoch += 1
        self._probes.clear()
        self._probe_successes = 0
        if old is CircuitState.CLOSED and new is CircuitState.OPEN:
            # A peer that fails again within a healthy period of closing is the same episode.
            self._loud = (
                self._closed_at is None or at - self._closed_at >= self._config.decay_after_s
            )
        self._log_transition(old, new, failures, reason)
        if new is CircuitState.CLOSED:
            self._consecutive_failures = 0
            self._opened_at = None
            self._healthy_since = at
            self._closed_at = at
        elif new is CircuitState.OPEN:
            self._opened_at = at
        for listener in list(self._listeners):
            try:
                listener(self.name, old, new)
            except Exception:
                logger.warning(
                    "listener %r of circuit %s failed on %s -> %s",
                    listener,
                    self.name,
                    old.value,
                    new.value,
                    exc_info=True,
                )

    def _log_transition(
        self, old: CircuitState, new: CircuitState, failures: int, reason: str
    ) -> None:
        """WARNING when a peer starts failing, INFO when it recovers; the rest of an episode, and
        an episode that starts within `decay_after_s` of the last one ending, at DEBUG."""
        if new is CircuitState.OPEN and old is CircuitState.CLOSED:
            logger.log(
                logging.WARNING if self._loud else logging.DEBUG,
                "circuit %s opened after %d consecutive failures (%s); retry in %.1f s",
                self.name,
                failures,
                reason,
                self._recovery_s,
            )
        elif new is CircuitState.OPEN:
            logger.debug(
                "circuit %s still failing (%s); open again for %.1f s",
                self.name,
                reason,
                self._recovery_s,
            )
        elif new is CircuitState.CLOSED:
            logger.log(
                logging.INFO if self._loud else logging.DEBUG,
                "circuit %s closed (%s)",
                self.name,
                reason,
            )
        else:
            logger.debug("circuit %s half-open: admitting probe calls", self.name)
