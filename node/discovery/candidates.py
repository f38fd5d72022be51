"""Peer candidates and this node's advert; the static candidate sources (inventory, seeds)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import Literal

from config import ConfigError, Inventory
from node.addresses import normalize_address
from node.errors import DiscoveryError

CandidateSource = Literal["mdns", "inventory", "seed"]


@dataclass(frozen=True)
class Candidate:
    """A peer worth probing at (address, port); `node_id` when the source knows it."""

    address: str
    port: int
    source: CandidateSource
    node_id: str | None = None


@dataclass(frozen=True)
class Advert:
    """What this node tells the LAN about itself by mDNS. Never holds a secret."""

    node_id: str
    cluster: str
    version: str
    port: int
    addresses: tuple[str, ...]


def inventory_candidates(inventory: Inventory, advert: Advert) -> list[Candidate]:
    """Every inventory host except this node (by id, or by its own address and port)."""
    own = {normalize_address(address) for address in advert.addresses}
    return [
        Candidate(host.address, host.p2p_port, "inventory", name)
        for name, host in sorted(inventory.hosts.items())
        if name != advert.node_id
        and not (normalize_address(host.address) in own and host.p2p_port == advert.port)
    ]


def parse_seed(seed: str) -> tuple[str, int]:
    """(host, port) of a `HOST:PORT` seed; IPv6 hosts are written `[addr]:port`."""
    host, sep, port_text = seed.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"seed {seed!r}: must be HOST:PORT (IPv6 as [ADDRESS]:PORT)")
    return host, int(port_text)


async def resolve_host(host: str, port: int, timeout_s: float) -> list[str]:
    """The distinct addresses of `host` (IPv4 first); an IP address is returned as it is.

    Raises DiscoveryError when the name does not resolve within `timeout_s`.
    """
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except TimeoutError as exc:
        raise DiscoveryError(f"resolving {host}: no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise DiscoveryError(f"resolving {host}: {exc}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise DiscoveryError(f"resolving {host}: no addresses")
    return [a for a in addresses if ":" not in a] + [a for a in addresses if ":" in a]
