"""The timers of one membership: outstanding probes and ping-req relays, and running suspicions.

Both own event-loop handles; `close` cancels every one of them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from node.membership.rules import Suspicion
from node.membership.types import Address

_SEQ_MODULUS = 1 << 62


@dataclass(slots=True)
class ProbeWait:
    """Our probe of `target`: resolved by its ack (direct or relayed); relays that report
    failure are collected in `nackers`."""

    target: str
    future: asyncio.Future[str]
    relays: frozenset[str] = frozenset()
    nackers: set[str] = field(default_factory=set)


@dataclass(slots=True)
class RelayWait:
    """A ping we send for `requester`'s ping-req: forward the ack, or nack when `handle` fires."""

    target: str
    requester: Address
    origin_seq: int
    handle: asyncio.TimerHandle | None = None


class AckTable:
    """Sequence numbers awaiting an ack. Numbers start at a random point so an old datagram
    replayed later does not match a new probe."""

    def __init__(self, rng: random.Random) -> None:
        self._seq = rng.randrange(1 << 40)
        self._waits: dict[int, ProbeWait | RelayWait] = {}

    def next_seq(self) -> int:
        self._seq = (self._seq + 1) % _SEQ_MODULUS
        return self._seq

    def expect(self, target: str) -> tuple[int, ProbeWait]:
        seq = self.next_seq()
        wait = ProbeWait(target, asyncio.get_running_loop().create_future())
        self._waits[seq] = wait
        return seq, wait

    def relay(
        self,
        target: str,
        requester: Address,
        origin_seq: int,
        nack_after_s: float,
        on_expire: Callable[[RelayWait], None],
    ) -> int:
        seq = self.next_seq()
        wait = RelayWait(target, requester, origin_seq)
        wait.handle = asyncio.get_running_loop().call_later(
            nack_after_s, self._expire, seq, on_expire
        )
        self._waits[seq] = wait
        return seq

    def _expire(self, seq: int, on_expire: Callable[[RelayWait], None]) -> None:
        wait = self._waits.pop(seq, None)
        if isinstance(wait, RelayWait):
            on_expire(wait)

    def on_ack(self, seq: int, sender: str) -> RelayWait | None:
        """Resolve our probe `seq`, or return the relay whose requester the ack is forwarded to."""
        wait = self._waits.get(seq)
        if isinstance(wait, ProbeWait):
            if (sender == wait.target or sender in wait.relays) and not wait.future.done():
                wait.future.set_result(sender)
            return None
        if isinstance(wait, RelayWait) and sender == wait.target:
            del self._waits[seq]
            if wait.handle is not None:
                wait.handle.cancel()
            return wait
        return None

    def heard(self, sender: str) -> list[RelayWait]:
        """`sender` sent us something: it is alive, whatever became of its ack (which may wait
        behind its bulk traffic). Resolves our probes of it; returns the relays whose requester
        is told so (their waits end here)."""
        relays = []
        for seq, wait in list(self._waits.items()):
            if wait.target != sender:
                continue
            if isinstance(wait, ProbeWait):
                if not wait.future.done():
                    wait.future.set_result(sender)
            else:
                del self._waits[seq]
                if wait.handle is not None:
                    wait.handle.cancel()
                relays.append(wait)
        return relays

    def on_nack(self, seq: int, sender: str) -> None:
        wait = self._waits.get(seq)
        if isinstance(wait, ProbeWait) and sender in wait.relays:
            wait.nackers.add(sender)

    def forget(self, seq: int) -> None:
        wait = self._waits.pop(seq, None)
        if isinstance(wait, ProbeWait) and not wait.future.done():
            wait.future.cancel()
        elif isinstance(wait, RelayWait) and wait.handle is not None:
            wait.handle.cancel()

    def close(self) -> None:
        """Cancel every outstanding wait. Idempotent."""
        for seq in list(self._waits):
            self.forget(seq)


@dataclass(slots=True)
class _Running:
    suspicion: Suspicion
    handle: asyncio.TimerHandle
    checked_from: float


ExpireCallback = Callable[[Suspicion, float, float], None]
"""Called with the suspicion, the time it was due, and the start of the window to check for
stalls of our own loop."""


class SuspicionTimers:
    """Running suspicions, one timer each; a confirmation that shortens a suspicion re-arms it."""

    def __init__(self, clock: Callable[[], float], on_expire: ExpireCallback) -> None:
        self._clock = clock
        self._on_expire = on_expire
        self._running: dict[str, _Running] = {}

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._running

    def get(self, node_id: str) -> Suspicion | None:
        running = self._running.get(node_id)
        return None if running is None else running.suspicion

    def start(self, suspicion: Suspicion, checked_from: float | None = None) -> None:
        """Run `suspicion` until its deadline (replacing one of the same member)."""
        self.cancel(suspicion.node_id)
        due = suspicion.deadline
        delay = max(0.0, due - self._clock())
        handle = asyncio.get_running_loop().call_later(delay, self._fire, suspicion.node_id, due)
        start = suspicion.started_at if checked_from is None else checked_from
        self._running[suspicion.node_id] = _Running(suspicion, handle, start)

    def extend(self, suspicion: Suspicion, delay_s: float, checked_from: float) -> None:
        """Run `suspicion` `delay_s` longer: our loop stalled, a refutation may still be queued."""
        self.cancel(suspicion.node_id)
        due = self._clock() + delay_s
        handle = asyncio.get_running_loop().call_later(delay_s, self._fire, suspicion.node_id, due)
        self._running[suspicion.node_id] = _Running(suspicion, handle, checked_from)

    def confirm(self, node_id: str, by: str) -> bool:
        """Count `by` as an independent suspecter; True if it was new."""
        running = self._running.get(node_id)
        if running is None:
            return False
        confirmed = running.suspicion.confirmed_by(by)
        if confirmed is running.suspicion:
            return False
        if confirmed.deadline != running.suspicion.deadline:
            self.start(confirmed, running.checked_from)
        else:
            running.suspicion = confirmed
        return True

    def _fire(self, node_id: str, due: float) -> None:
        running = self._running.pop(node_id, None)
        if running is not None:
            self._on_expire(running.suspicion, due, running.checked_from)

    def cancel(self, node_id: str) -> None:
        running = self._running.pop(node_id, None)
        if running is not None:
            running.handle.cancel()

    def close(self) -> None:
        """Cancel every timer. Idempotent."""
        for node_id in list(self._running):
            self.cancel(node_id)
