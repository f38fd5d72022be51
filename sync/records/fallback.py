"""P2PFallbackSync: pull games from a primary peer, falling back to the next host on failure.

Built on P2PSyncClient: each host is asked in order, each within its own timeout, until one
answers with at least `min_games` games.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from config import AsyncClosing, NodeSettings, Timeouts
from net import Identity, PeerClient
from sync.errors import RecordRequestError, StoreClosedError, SyncError
from sync.records.pull import P2PSyncClient

__all__ = ["GamesPull", "P2PFallbackSync", "split_host"]

logger = logging.getLogger(__name__)

DEFAULT_PORT: int = NodeSettings.model_fields["port"].default


def split_host(host: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """`"10.0.0.1"`, `"10.0.0.1:8770"`, `"[::1]:8770"` or `"::1"` -> (address, port).

    ValueError naming the host when the port is not a number 1-65535.
    """
    text = host.strip()
    if text.startswith("["):
        address, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        address, _, port_text = text.partition(":")
    else:
        address, port_text = text, ""
    if not address:
        raise ValueError(f"host {host!r}: no address")
    if not port_text:
        return address, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"host {host!r}: port must be a number 1-65535, got {port_text!r}")
    return address, int(port_text)


@dataclass(frozen=True)
class GamesPull:
    """The games one host gave (`host` as given), and the (host, error) of each host before it."""

    host: str
    games: list[dict[str, Any]]
    errors: tuple[tuple[str, str], ...] = ()


class P2PFallbackSync(AsyncClosing):
    """Pulls games from `primary_host`, then each of `fallback_hosts` in order (each host once),
    until one answers with at least `min_games` games; each host gets `timeout` seconds (async
    context manager; close() is idempotent). Hosts are `address` or `address:port` (default
    port 8770).

    Signs requests with `secret` as `node_id` when given.
    """

    def __init__(
        self,
        primary_host: str,
        fallback_hosts: Sequence[str] = (),
        timeout: float = 30.0,
        *,
        secret: bytes | None = None,
        node_id: str = "cli-shoal",
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        hosts = [primary_host]
        for host in fallback_hosts:
            if host not in hosts:
                hosts.append(host)
        self.hosts: tuple[str, ...] = tuple(hosts)
        self._targets = [split_host(host) for host in self.hosts]
        self.timeout_s = timeout
        self._identity = Identity(secret, node_id)
        self._peers: PeerClient | None = None
        self._closed = False

    async def close(self) -> None:
        """Close the peer client; the object is unusable afterwards. Idempotent."""
        self._closed = True
        peers, self._peers = self._peers, None
        if peers is not None:
            await peers.close()

    async def pull_games(
        self, board_type: str | None = None, min_games: int = 1, since: float = 0.0
    ) -> GamesPull:
        """Games created at or after `since` (of `board_type` when given) from the first host
        that answers with at least `min_games` of them. RecordRequestError naming every host
        and why when none does."""
        if self._closed:
            raise StoreClosedError("P2PFallbackSync is closed; create a new one")
        if self._peers is None:
            timeouts = Timeouts(http_request_s=self.timeout_s)
            self._peers = PeerClient(self._identity, timeouts=timeouts)
        filters = {} if board_type is None else {"board_type": board_type}
        errors: list[tuple[str, str]] = []
        for host, (address, port) in zip(self.hosts, self._targets, strict=True):
            client = P2PSyncClient(address, port, peers=self._peers)
            try:
                async with asyncio.timeout(self.timeout_s):
                    games = await client.pull_games_since(since, filters)
            except TimeoutError:
                errors.append((host, f"no answer within {self.timeout_s:g} s"))
                continue
            except SyncError as exc:
                errors.append((host, str(exc)))
                logger.debug("games from %s failed: %s", host, exc)
                continue
            if len(games) < min_games:
                errors.append((host, f"has {len(games)} games, fewer than min_games={min_games}"))
                continue
            return GamesPull(host, games, tuple(errors))
        tried = "; ".join(f"{host}: {error}" for host, error in errors)
        raise RecordRequestError(f"no host gave the games ({tried})")
