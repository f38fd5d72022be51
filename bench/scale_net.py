"""A virtual-time event loop and a simulated datagram network for bench/scale_sim.py.

`VirtualLoop` is an asyncio loop whose clock jumps to the next timer instead of waiting: the
membership code runs unchanged on it (its coroutines, futures, `call_later` and `clock`), and a
seeded run repeats exactly. Timers and deliveries share one heap of tuples keyed by virtual time
(no handle object per datagram). `SimNetwork` carries membership bodies between members with a
one-way delay, loss, partitions and crashes, and counts each datagram at the size the daemon puts
on the wire: the body plus the v3 envelope (AES-256-GCM) around it, or, with `seal=True`, by
really sealing and opening every datagram through the daemon's `SealedChannel`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sys
import tempfile
import traceback
from collections.abc import Callable
from heapq import heappop, heappush
from pathlib import Path
from typing import Any

from node.membership.channel import SealedChannel
from node.membership.envelope import Envelope
from node.membership.keyring import GossipKeys, Keyring, new_key
from node.membership.transport import Counters, DatagramHandler, TransportStats
from node.membership.types import Address

CLUSTER = "scale"


class _Timer:
    """What `call_at` returns: only `cancel()` (and `when()`) are part of the contract."""

    __slots__ = ("_when", "cancelled")

    def __init__(self, when: float) -> None:
        self._when = when
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def when(self) -> float:
        return self._when


class VirtualLoop(asyncio.BaseEventLoop):
    """An event loop with a virtual clock: when nothing is ready, time jumps to the next timer.

    An exception escaping a timer callback ends the run (a simulation with a bug must fail). In
    a branch forked by bench/scale_fork.py (`in_branch`) it ends the process: it unwinds past the
    branch's coroutine into the frames copied from the parent, which must not go on as if they
    were the parent."""

    def __init__(self, start_s: float = 1000.0) -> None:
        super().__init__()
        self._now = start_s
        self._timers: list[tuple[float, int, Callable[..., object], tuple[Any, ...], Any]] = []
        self._seq = itertools.count()
        self.events_run = 0
        self.in_branch = False

    def time(self) -> float:
        return self._now

    def call_at(  # type: ignore[override]  # any timer that has cancel() and when() will do
        self, when: float, callback: Callable[..., object], *args: Any, **_: Any
    ) -> Any:
        timer = _Timer(when)
        heappush(self._timers, (when, next(self._seq), callback, args, timer))
        return timer

    def call_later(  # type: ignore[override]
        self, delay: float, callback: Callable[..., object], *args: Any, **_: Any
    ) -> Any:
        return self.call_at(self._now + max(0.0, delay), callback, *args)

    def deliver_at(self, when: float, callback: Callable[..., object], *args: Any) -> None:
        """Run `callback(*args)` at `when`; not cancellable (a datagram in flight)."""
        heappush(self._timers, (when, next(self._seq), callback, args, None))

    def run_forever(self) -> None:
        try:
            super().run_forever()
        except BaseException:
            if self.in_branch:
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
            raise

    def _run_once(self) -> None:
        ready = self._ready  # type: ignore[attr-defined]  # BaseEventLoop's, not in its stubs
        if not ready:
            timers = self._timers
            while timers:
                when, _, callback, args, timer = heappop(timers)
                if timer is not None and timer.cancelled:
                    continue
                if when > self._now:
                    self._now = when
                self.events_run += 1
                callback(*args)
                break
            else:
                raise RuntimeError("the simulation has nothing left to run")
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def _process_events(self, event_list: Any) -> None:  # no I/O in a simulation
        return None

    def _write_to_self(self) -> None:
        return None


def gossip_envelope() -> Envelope:
    """The envelope the daemon seals with: a cluster id and a gossip keyring (v3)."""
    with tempfile.TemporaryDirectory() as where:
        keys = GossipKeys(Path(where) / "keyring.json", Keyring.of([], new_key()))
    return Envelope(CLUSTER, keys=keys)


def sealed_overhead_bytes(envelope: Envelope) -> int:
    """Bytes a v3 envelope adds to a body (the same for every body: AES-GCM does not pad)."""
    body = b'{"t":"ping","f":"node-00001","s":1,"to":"node-00002"}'
    return len(envelope.seal(body, 0.0, boot=1, seq=1)) - len(body)


class SimNetwork:
    """Members by host address on one `VirtualLoop`: one-way delay `delay_s` plus up to
    `jitter_s`, loss `loss` (a fraction of datagrams, drawn from `rng`), partitions (`sides`:
    host -> group; hosts of different groups do not reach each other) and crashed hosts."""

    def __init__(
        self,
        loop: VirtualLoop,
        rng: random.Random,
        *,
        delay_s: float = 0.0005,
        jitter_s: float = 0.001,
        seal: bool = False,
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.loss = 0.0
        self.sides: dict[str, int] = {}
        self.crashed: set[str] = set()
        self.envelope = gossip_envelope()
        self.overhead_bytes = sealed_overhead_bytes(self.envelope)
        self.seal = seal
        self._boots = random.Random(0)
        self.sent_bytes = 0
        self.sent_datagrams = 0
        self.endpoints: dict[str, SimEndpoint] = {}

    def endpoint(self, address: str, port: int) -> SimEndpoint:
        channel = None
        if self.seal:  # boot ids from a generator of their own: sealing changes no other draw
            channel = SealedChannel(self.envelope, boot=self._boots.getrandbits(62))
        endpoint = SimEndpoint(self, (address, port), channel)
        self.endpoints[address] = endpoint
        return endpoint

    def transmit(self, source: Address, destination: Address, datagram: bytes, size: int) -> None:
        self.sent_bytes += size
        self.sent_datagrams += 1
        host = destination[0]
        if host in self.crashed or source[0] in self.crashed:
            return
        sides = self.sides
        if sides and sides.get(source[0], 0) != sides.get(host, 0):
            return
        rng = self.rng
        if self.loss and rng.random() < self.loss:
            return
        target = self.endpoints.get(host)
        if target is None:
            return
        when = self.loop._now + self.delay_s + rng.random() * self.jitter_s
        self.loop.deliver_at(when, target.receive, datagram, source)


class SimEndpoint:
    """One member's `MembershipTransport` on a `SimNetwork`."""

    def __init__(self, network: SimNetwork, local: Address, channel: SealedChannel | None) -> None:
        self._network = network
        self.local_address = local
        self._channel = channel
        self._handler: DatagramHandler | None = None
        self._counters = Counters()
        self._body_budget = network.envelope.body_budget

    @property
    def cluster(self) -> str:
        return CLUSTER

    @property
    def body_budget(self) -> int:
        return self._body_budget

    async def start(self, handler: DatagramHandler) -> None:
        self._handler = handler

    def send(self, body: bytes, address: Address) -> None:
        if self._handler is None:
            return
        network = self._network
        if self._channel is None:
            size = len(body) + network.overhead_bytes
            network.transmit(self.local_address, address, body, size)
            return
        datagram = self._channel.seal(body, network.loop.time(), f"{address[0]}:{address[1]}")
        network.transmit(self.local_address, address, datagram, len(datagram))

    def receive(self, datagram: bytes, source: Address) -> None:
        handler = self._handler
        if handler is None:
            return
        if self._channel is not None:
            opened = self._channel.open(datagram, self._network.loop.time())
            if opened.body is None:
                self._counters.dropped[str(opened.drop)] += 1
                return
            datagram = opened.body
        handler(datagram, source)

    def stats(self) -> TransportStats:
        return self._counters.snapshot()

    async def close(self) -> None:
        self._handler = None
