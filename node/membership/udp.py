"""`UdpMembershipTransport`: membership datagrams over UDP on the HTTP API's port number,
sealed with AES-256-GCM by the gossip keyring, or signed with HMAC-SHA256 by the cluster secret
without one (see `node.membership.wire` for the format).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Callable

from node.errors import MembershipError
from node.membership.channel import SealedChannel
from node.membership.envelope import MAX_DATAGRAM_BYTES, Envelope
from node.membership.keyring import GossipKeys
from node.membership.transport import Counters, DatagramHandler, TransportStats
from node.membership.types import Address

log = logging.getLogger(__name__)


DSCP_CS6 = 0xC0
"""The TOS / traffic class byte of membership datagrams: DSCP CS6, network control (RFC 4594),
which networks that honour DSCP queue ahead of bulk traffic."""
SOCKET_PRIORITY = 6
"""SO_PRIORITY of the membership socket: TC_PRIO_INTERACTIVE, the first band of the host's own
pfifo_fast or prio qdisc, so a probe or its ack never waits behind a checkpoint transfer
queued on the same link (a busy member is not a dead one). Set after the TOS byte, which
would otherwise reset it (Linux maps TOS to a priority when IP_TOS is set)."""


def mark_priority(sock: socket.socket, *, ipv6: bool) -> list[str]:
    """Mark `sock`'s datagrams as network control (DSCP CS6) and put them in the host qdisc's
    first band (SO_PRIORITY 6). Best effort: returns the options the platform refused."""
    options = [
        (socket.IPPROTO_IP, socket.IP_TOS, DSCP_CS6, "IP_TOS"),
        (socket.IPPROTO_IPV6, getattr(socket, "IPV6_TCLASS", -1), DSCP_CS6, "IPV6_TCLASS"),
        (socket.SOL_SOCKET, getattr(socket, "SO_PRIORITY", -1), SOCKET_PRIORITY, "SO_PRIORITY"),
    ]
    refused = []
    for level, option, value, name in options:
        if (name == "IPV6_TCLASS" and not ipv6) or option < 0:
            continue
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            refused.append(name)
    return refused


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, owner: UdpMembershipTransport) -> None:
        self._owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        host = str(addr[0])
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]  # an IPv4 peer seen through a dual-stack socket
        self._owner.received(data, (host, int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        self._owner.network_error("receive", exc)


class UdpMembershipTransport:
    """A UDP socket bound to (bind_address, port), owned from `bind`/`start` until `close`.

    Without a secret every datagram of our cluster is accepted (dev mode; the daemon refuses that
    beyond loopback unless told --insecure). With one, unsigned, badly signed and stale (more
    than max_skew_s off) datagrams are dropped silently with a DEBUG log and a counter, as are
    replays of a datagram already received (per-sender sequence windows,
    `node.membership.channel`). Datagrams naming another cluster id are dropped and counted
    (`cluster`), logged at WARNING once per foreign id; those naming none are taken as ours.
    With `keys` (a gossip keyring) every datagram goes out sealed by its key in use and one
    naming a key the ring lacks is refused (`unknown_key`, logged at WARNING once per key id,
    naming it); a peer of the previous release (v2 envelope, signed with the secret) is
    accepted and answered in v2. Destinations must be IP literals: resolve names beforehand.
    """

    def __init__(
        self,
        bind_address: str,
        port: int,
        *,
        secret: bytes | None,
        cluster: str,
        max_skew_s: float = 300.0,
        wall_clock: Callable[[], float] = time.time,
        keys: GossipKeys | None = None,
    ) -> None:
        self._bind = (bind_address, port)
        self._channel = SealedChannel(Envelope(cluster, secret, max_skew_s, keys))
        self._wall_clock = wall_clock
        self._transport: asyncio.DatagramTransport | None = None
        self._handler: DatagramHandler | None = None
        self._counters = Counters()
        self._closed = False
        self._warned: set[str] = set()
        self._ipv6 = False

    @property
    def cluster(self) -> str:
        return self._channel.cluster

    @property
    def body_budget(self) -> int:
        return self._channel.body_budget

    @property
    def local_address(self) -> Address:
        """The bound (address, port); binds happen in `bind` or `start`."""
        if self._transport is None:
            raise MembershipError("UDP membership transport is not bound")
        name = self._transport.get_extra_info("sockname")
        return (str(name[0]), int(name[1]))

    async def bind(self) -> Address:
        """Bind the socket (port 0 picks one) and return the bound address. Idempotent."""
        if self._closed:
            raise MembershipError("UDP membership transport is closed")
        if self._transport is not None:
            return self.local_address
        host, port = self._bind
        envelope = self._channel.envelope
        if envelope.secret is None and envelope.keys is None and not _is_loopback(host):
            log.warning(
                "membership UDP on %s:%s accepts unsigned datagrams (no secret)", host, port
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._ipv6 = family == socket.AF_INET6
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Protocol(self), local_addr=(host, port), family=family
            )
        except OSError as exc:
            raise MembershipError(
                f"cannot bind membership UDP on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        self._transport = transport
        sock = transport.get_extra_info("socket")
        refused = mark_priority(sock, ipv6=self._ipv6) if sock is not None else []
        if refused:
            log.debug("membership UDP: %s not set; datagrams share the bulk queue", refused)
        return self.local_address

    async def start(self, handler: DatagramHandler) -> None:
        await self.bind()
        self._handler = handler

    def send(self, body: bytes, address: Address) -> None:
        if self._transport is None or self._closed:
            return
        datagram = self._channel.seal(body, self._wall_clock(), f"{address[0]}:{address[1]}")
        if len(datagram) > MAX_DATAGRAM_BYTES:
            self._counters.dropped["oversize_send"] += 1
            log.debug("not sending a %d-byte membership datagram to %s", len(datagram), address)
            return
        if self._ipv6 and ":" not in address[0]:
            address = (f"::ffff:{address[0]}", address[1])
        try:
            self._transport.sendto(datagram, address)
        except (OSError, ValueError) as exc:
            self.network_error(f"send to {address[0]}:{address[1]}", exc)
            return
        self._counters.sent_datagrams += 1
        self._counters.sent_bytes += len(datagram)

    def received(self, datagram: bytes, source: Address) -> None:
        if self._handler is None or self._closed:
            return
        where = f"{source[0]}:{source[1]}"
        opened = self._channel.open(datagram, self._wall_clock(), where)
        self._channel.note(opened, where)
        if opened.body is None:
            self._counters.dropped[str(opened.drop)] += 1
            return
        self._counters.received_datagrams += 1
        self._counters.received_bytes += len(datagram)
        self._handler(opened.body, source)

    def network_error(self, what: str, exc: Exception) -> None:
        """Log a socket error once at WARNING per kind of operation, then at DEBUG."""
        self._counters.dropped["network_error"] += 1
        key = what.split(" ", 1)[0] + type(exc).__name__
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        log.log(level, "membership UDP %s failed: %s", what, exc)

    def stats(self) -> TransportStats:
        return self._counters.snapshot()

    async def close(self) -> None:
        """Close the socket. Idempotent; a closed transport cannot be reopened."""
        if self._closed:
            return
        self._closed = True
        self._handler = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            await asyncio.sleep(0)  # let the loop run connection_lost and release the socket
