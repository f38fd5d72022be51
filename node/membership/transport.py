"""The membership transport seam, and `InMemoryNetwork`: a deterministic fault-injecting network
(delay, jitter, loss, partitions, one-way cuts, isolated hosts) for tests and simulations.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from node.errors import MembershipError
from node.membership.channel import SealedChannel
from node.membership.envelope import Envelope
from node.membership.keyring import GossipKeys
from node.membership.types import Address

log = logging.getLogger(__name__)

DatagramHandler = Callable[[bytes, Address], None]
"""Called with each accepted body and the (address, port) it came from."""


@dataclass(frozen=True, slots=True)
class TransportStats:
    """Counters of one transport; `dropped` counts refused datagrams by reason."""

    sent_datagrams: int = 0
    sent_bytes: int = 0
    received_datagrams: int = 0
    received_bytes: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)


class MembershipTransport(Protocol):
    """Unreliable datagrams between members. The transport owns the envelope: it seals what it
    sends and hands the handler only bodies of its cluster that pass authentication."""

    @property
    def cluster(self) -> str: ...

    @property
    def body_budget(self) -> int:
        """The largest body one datagram carries."""
        ...

    async def start(self, handler: DatagramHandler) -> None:
        """Begin delivering received bodies to `handler`."""
        ...

    def send(self, body: bytes, address: Address) -> None:
        """Send one body; best effort, never raises for network errors."""
        ...

    def stats(self) -> TransportStats: ...

    async def close(self) -> None:
        """Stop sending and receiving. Idempotent."""
        ...


@dataclass(slots=True)
class Counters:
    """Mutable counters a transport owns; `snapshot` freezes them."""

    sent_datagrams: int = 0
    sent_bytes: int = 0
    received_datagrams: int = 0
    received_bytes: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> TransportStats:
        return TransportStats(
            self.sent_datagrams,
            self.sent_bytes,
            self.received_datagrams,
            self.received_bytes,
            dict(self.dropped),
        )


class InMemoryNetwork:
    """Hosts (by address) exchanging datagrams on the running event loop.

    Every random choice (loss, jitter) comes from the injected `rng`, so a seeded run repeats.
    Faults act on host addresses: `partition`, `cut` (one way), `isolate` (a crash seen from the
    network), `saturate` (a busy uplink). `close` cancels every delivery still in flight.
    """

    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        delay_s: float = 0.0,
        jitter_s: float = 0.0,
        drop_rate: float = 0.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._rng = rng or random.Random(0)
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.drop_rate = drop_rate
        self.wall_clock = wall_clock
        self._endpoints: dict[Address, InMemoryEndpoint] = {}
        self._groups: dict[str, int] = {}
        self._cuts: set[tuple[str, str]] = set()
        self._isolated: set[str] = set()
        self._egress_delay_s: dict[str, float] = {}
        self._bytes_sent: Counter[str] = Counter()
        self._in_flight: dict[int, asyncio.TimerHandle] = {}
        self._next_key = 0

    def endpoint(
        self,
        address: str,
        port: int,
        *,
        cluster: str = "lab",
        secret: bytes | None = None,
        keys: GossipKeys | None = None,
    ) -> InMemoryEndpoint:
        """A transport for the member at (address, port), sealing with `keys` when given."""
        if (address, port) in self._endpoints:
            raise MembershipError(f"{address}:{port} is already attached to this network")
        envelope = Envelope(cluster, secret, keys=keys)
        channel = SealedChannel(envelope, boot=self._rng.getrandbits(62))
        endpoint = InMemoryEndpoint(self, (address, port), channel)
        self._endpoints[(address, port)] = endpoint
        return endpoint

    def partition(self, *groups: Iterable[str]) -> None:
        """Only hosts of the same group reach each other (hosts in no group form one more)."""
        self._groups = {host: index for index, group in enumerate(groups) for host in group}

    def cut(self, source: str, destination: str) -> None:
        """Drop everything `source` sends to `destination` (the reverse direction still works)."""
        self._cuts.add((source, destination))

    def isolate(self, host: str) -> None:
        """Drop everything to and from `host`, as if it had crashed."""
        self._isolated.add(host)

    def saturate(self, host: str, queue_s: float) -> None:
        """Everything `host` sends waits `queue_s` longer, in order, as behind a saturated
        uplink's queue (0 lifts it); a crash (`isolate`) still drops what is queued."""
        self._egress_delay_s[host] = queue_s

    def rejoin(self, host: str) -> None:
        self._isolated.discard(host)

    def heal(self) -> None:
        """Remove partitions and cuts (isolated hosts stay isolated)."""
        self._groups = {}
        self._cuts.clear()

    def bytes_sent(self, host: str) -> int:
        """Datagram bytes `host` has sent, delivered or not."""
        return self._bytes_sent[host]

    def total_bytes_sent(self) -> int:
        return sum(self._bytes_sent.values())

    def blocked(self, source: str, destination: str) -> bool:
        if source in self._isolated or destination in self._isolated:
            return True
        if (source, destination) in self._cuts:
            return True
        return self._groups.get(source, -1) != self._groups.get(destination, -1)

    def close(self) -> None:
        """Cancel every delivery in flight. Idempotent."""
        for handle in self._in_flight.values():
            handle.cancel()
        self._in_flight.clear()

    def transmit(self, source: Address, destination: Address, datagram: bytes) -> None:
        self._bytes_sent[source[0]] += len(datagram)
        if self.blocked(source[0], destination[0]):
            return
        if self.drop_rate and self._rng.random() < self.drop_rate:
            return
        delay = self.delay_s + self._egress_delay_s.get(source[0], 0.0)
        delay += self._rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0
        key = self._next_key
        self._next_key += 1
        loop = asyncio.get_running_loop()
        self._in_flight[key] = loop.call_later(
            delay, self._arrive, key, source, destination, datagram
        )

    def _arrive(self, key: int, source: Address, destination: Address, datagram: bytes) -> None:
        self._in_flight.pop(key, None)
        endpoint = self._endpoints.get(destination)
        if endpoint is None or self.blocked(source[0], destination[0]):
            return
        endpoint.receive(datagram, source)

    def detach(self, endpoint: InMemoryEndpoint) -> None:
        if self._endpoints.get(endpoint.local_address) is endpoint:
            del self._endpoints[endpoint.local_address]


class InMemoryEndpoint:
    """One member's `MembershipTransport` on an `InMemoryNetwork`."""

    def __init__(self, network: InMemoryNetwork, local: Address, channel: SealedChannel) -> None:
        self._network = network
        self.local_address = local
        self._channel = channel
        self._handler: DatagramHandler | None = None
        self._closed = False
        self._counters = Counters()

    @property
    def cluster(self) -> str:
        return self._channel.cluster

    @property
    def body_budget(self) -> int:
        return self._channel.body_budget

    async def start(self, handler: DatagramHandler) -> None:
        if self._closed:
            raise MembershipError("transport is closed")
        self._handler = handler

    def send(self, body: bytes, address: Address) -> None:
        if self._closed:
            return
        to = f"{address[0]}:{address[1]}"
        datagram = self._channel.seal(body, self._network.wall_clock(), to)
        self._counters.sent_datagrams += 1
        self._counters.sent_bytes += len(datagram)
        self._network.transmit(self.local_address, address, datagram)

    def receive(self, datagram: bytes, source: Address) -> None:
        if self._closed or self._handler is None:
            return
        where = f"{source[0]}:{source[1]}"
        opened = self._channel.open(datagram, self._network.wall_clock(), where)
        self._channel.note(opened, where)
        if opened.body is None:
            self._counters.dropped[str(opened.drop)] += 1
            return
        self._counters.received_datagrams += 1
        self._counters.received_bytes += len(datagram)
        self._handler(opened.body, source)

    def stats(self) -> TransportStats:
        return self._counters.snapshot()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._handler = None
        self._network.detach(self)
