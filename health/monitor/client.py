"""ClusterMonitor: asks every node of a cluster for its status, concurrently and each within a
timeout, and turns the answers (or why there are none) into a ClusterStatus.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import socket
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from yarl import URL

from config import Timeouts
from config.closing import AsyncClosing
from health.errors import FetchError, MonitorError, describe_fetch_error, fetch_error
from health.monitor.model import ClusterStatus, NodeReport, Observation, parse_peers, parse_status
from health.monitor.rules import build_cluster_status
from net import PeerRequestError, base_url, peer_url

if TYPE_CHECKING:
    import ssl

    from config import Inventory
    from net import PeerClient

__all__ = [
    "DEFAULT_NODE_URL",
    "DEFAULT_TIMEOUT_S",
    "ClusterMonitor",
    "describe_fetch_error",
    "node_url",
    "normalize_node_url",
]

logger = logging.getLogger(__name__)

DEFAULT_NODE_URL = "http://127.0.0.1:8770"
DEFAULT_TIMEOUT_S = Timeouts().peer_status_s
DEFAULT_PEER_VIEWS = 3
DEFAULT_MAX_CONCURRENCY = 256


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


@dataclass(frozen=True)
class _Target:
    url: str
    address: str
    port: int
    node_id: str | None


def node_url(address: str, port: int, scheme: str = "http") -> str:
    """The API base URL of a node at address:port (IPv6 addresses in brackets)."""
    return peer_url(address, port, tls=scheme == "https")


def normalize_node_url(text: str) -> str:
    """`http://HOST:PORT` from a URL or a bare `HOST:PORT`; MonitorError when it is neither."""
    text = text.strip()
    try:
        parsed = URL(text if "://" in text else base_url(text))
        host, port = parsed.host, parsed.port
    except (ValueError, PeerRequestError) as exc:
        raise MonitorError(f"not a node URL (http://HOST:PORT): {text!r}") from exc
    if parsed.scheme not in ("http", "https") or not host or parsed.path not in ("", "/"):
        raise MonitorError(f"not a node URL (http://HOST:PORT): {text!r}")
    if port is None:  # pragma: no cover - yarl fills the scheme's default port
        raise MonitorError(f"not a node URL (http://HOST:PORT): {text!r}")
    return str(parsed.origin())


def _target_of(url: str) -> _Target:
    parsed = URL(normalize_node_url(url))
    assert parsed.host is not None
    assert parsed.port is not None
    return _Target(str(parsed), parsed.host, parsed.port, None)


def _remembered(
    previous: ClusterStatus | None, seeds: Sequence[_Target], scheme: str
) -> list[_Target]:
    """Nodes of the previous refresh that are not seeds, so a dead seed hides nobody; a node
    that left and no longer answers is forgotten."""
    if previous is None:
        return []
    seed_ids = {t.node_id for t in seeds if t.node_id}
    endpoints = {(t.address, t.port) for t in seeds}
    return [
        _Target(node_url(row.address, row.port, scheme), row.address, row.port, row.node_id)
        for row in previous.nodes
        if row.node_id not in seed_ids
        and (row.address, row.port) not in endpoints
        and not (row.state == "left" and row.error is not None)
    ]


class ClusterMonitor(AsyncClosing):
    """Reads /v1/peers and /v1/status of a cluster's nodes through one net.PeerClient (a
    kept-alive session per node).

    With `nodes` (base URLs) the rest of the cluster is learned from their membership views; with
    `inventory` (or its file; InventoryError when unreadable) every listed host is asked too; with
    neither, the local node at DEFAULT_NODE_URL. With `threads`, requests go over urllib in up
    to that many threads (no aiohttp to import: a single round starts faster) instead of
    aiohttp's pools. Use `async with`; `close()` is idempotent and irreversible.
    """

    def __init__(
        self,
        nodes: Sequence[str] = (),
        inventory: Inventory | Path | str | None = None,
        secret: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        peer_views: int = DEFAULT_PEER_VIEWS,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        client_id: str | None = None,
        threads: int | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise MonitorError(f"timeout_s must be positive, got {timeout_s}")
        seeds = [_target_of(url) for url in nodes]
        if isinstance(inventory, Path | str):
            from config import load_inventory  # here: without an inventory, no inventory models

            inventory = load_inventory(inventory)
        if inventory is not None:
            seeds += [
                _Target(node_url(host.address, host.p2p_port), host.address, host.p2p_port, name)
                for name, host in sorted(inventory.hosts.items())
            ]
        if not seeds:
            seeds = [_target_of(DEFAULT_NODE_URL)]
        self._seeds = tuple(seeds)
        self._viewer_seeds = len(nodes) if nodes else min(len(seeds), peer_views)
        self._scheme = URL(self._seeds[0].url).scheme
        self._secret = secret
        self._timeout_s = timeout_s
        self._peer_views = max(1, peer_views)
        self._max_concurrency = max(1, max_concurrency)
        self._client_id = client_id or f"monitor-{socket.gethostname()}"
        self._state = _State.UNOPENED
        self._client: PeerClient | None = None
        self._names: dict[str, str] = {}
        """HOST:PORT -> the node id its server certificate must name (learnt from the views)."""
        self._threads = threads
        self._limit = asyncio.Semaphore(self._max_concurrency)
        self._previous: ClusterStatus | None = None

    async def _enter(self) -> None:
        self.open()

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def open(self) -> None:
        """Create the peer client (inside a running event loop). Refuses a closed monitor."""
        if self._state is _State.CLOSED:
            raise MonitorError("this ClusterMonitor is closed; make a new one")
        if self._state is _State.OPENED:
            return
        from config import ConfigError
        from config.tls.client import operator_context, server_name
        from net import Identity, PeerClient  # here: `cluster_monitor --help` loads no aiohttp

        try:
            context = operator_context()  # SHOAL_TLS_CERT/_KEY/_CA: https to auth tls nodes
        except ConfigError as exc:
            raise MonitorError("; ".join(exc.problems)) from exc
        names = self._names

        def tls(address: str) -> tuple[ssl.SSLContext, str] | None:
            # each node's certificate must name the node the view says is at that address
            return None if context is None else (context, server_name(address, names))

        transport = None
        if self._threads is not None:
            from net import ThreadedTransport

            transport = ThreadedTransport(ssl_context=lambda: context, max_threads=self._threads)
        self._client = PeerClient(
            Identity(self._secret, self._client_id),
            limit_per_peer=4,
            tls=tls,
            transport=transport,
        )
        self._state = _State.OPENED

    async def close(self) -> None:
        """Close the peer client. Idempotent and irreversible."""
        self._state = _State.CLOSED
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def get_cluster_status(self) -> ClusterStatus:
        """Ask the cluster once: views of up to `peer_views` nodes, the status of every node.

        Failures since the previous call of this monitor are in `recent_failures`.
        """
        self.open()
        now = time.time()
        seeds = [*self._seeds, *_remembered(self._previous, self._seeds, self._scheme)]
        viewers = seeds[: self._viewer_seeds]
        reports, views, answered = await self._round(seeds, viewers)
        known_ids = {t.node_id for t in seeds if t.node_id} | {
            r.status.node_id for r in reports if r.status is not None
        }
        known_endpoints = {(t.address, t.port) for t in seeds}
        members: dict[str, Observation] = {}
        for obs in views:
            if obs.node_id not in known_ids and (obs.address, obs.port) not in known_endpoints:
                members.setdefault(obs.node_id, obs)
        new = [
            _Target(node_url(o.address, o.port, self._scheme), o.address, o.port, o.node_id)
            for _, o in sorted(members.items())
        ]
        more_viewers = self._more_viewers(seeds, reports, new, answered)
        if new or more_viewers:
            more_reports, more_views, _ = await self._round(new, more_viewers)
            reports += more_reports
            views += more_views
        status = build_cluster_status(reports, views, now, self._previous)
        self._previous = status
        return status

    async def watch(self, interval_s: float) -> AsyncGenerator[ClusterStatus, None]:
        """A status now and then every `interval_s` (measured from the start of each refresh)."""
        if interval_s <= 0:
            raise MonitorError(f"interval_s must be positive, got {interval_s}")
        while True:
            started = time.monotonic()
            yield await self.get_cluster_status()
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))

    def _more_viewers(
        self,
        seeds: Sequence[_Target],
        reports: Sequence[NodeReport],
        new: Sequence[_Target],
        answered: int,
    ) -> list[_Target]:
        """Nodes to read views from when fewer than `peer_views` seeds gave one."""
        wanted = self._peer_views - answered
        if wanted <= 0:
            return []
        asked = {t.url for t in seeds[: self._viewer_seeds]}
        reachable = [
            _Target(r.url, r.address, r.port, r.status.node_id)
            for r in reports
            if r.status is not None and r.url not in asked
        ]
        return (reachable + list(new))[:wanted]

    async def _round(
        self, status_of: Sequence[_Target], views_of: Sequence[_Target]
    ) -> tuple[list[NodeReport], list[Observation], int]:
        """Status of `status_of` and views of `views_of`, all at once; (reports, views, views
        that answered)."""
        client = self._client
        if client is None:
            raise MonitorError("this ClusterMonitor is closed")
        for target in (*status_of, *views_of):
            if target.node_id:
                host = f"[{target.address}]" if ":" in target.address else target.address
                self._names[f"{host}:{target.port}"] = target.node_id
        async with asyncio.TaskGroup() as group:
            status_tasks = [group.create_task(self._report(client, t)) for t in status_of]
            view_tasks = [group.create_task(self._view(client, t)) for t in views_of]
        found = [task.result() for task in view_tasks]
        views = [obs for answer in found if answer is not None for obs in answer]
        answered = sum(1 for answer in found if answer is not None)
        return [task.result() for task in status_tasks], views, answered

    async def _report(self, client: PeerClient, target: _Target) -> NodeReport:
        try:
            status = parse_status(await self._get_json(client, target.url, "/v1/status"))
        except FetchError as exc:
            return NodeReport(target.url, target.address, target.port, target.node_id, None,
                              exc.reason)  # fmt: skip
        except ValueError as exc:
            return NodeReport(target.url, target.address, target.port, target.node_id, None,
                              f"bad status document: {exc}")  # fmt: skip
        return NodeReport(target.url, target.address, target.port, target.node_id, status, None)

    async def _view(self, client: PeerClient, target: _Target) -> tuple[Observation, ...] | None:
        try:
            return parse_peers(await self._get_json(client, target.url, "/v1/peers"))
        except (FetchError, ValueError) as exc:
            logger.debug("no membership view from %s: %s", target.url, exc)
            return None

    async def _get_json(self, client: PeerClient, url: str, path: str) -> Any:
        """The JSON body of GET url+path, or FetchError(reason) within the timeout."""
        from net import PeerRequestError

        async with self._limit:
            try:
                answer = await client.request("GET", url, path, timeout_s=self._timeout_s)
            except PeerRequestError as exc:
                raise fetch_error(exc, self._timeout_s) from exc
        try:
            return json.loads(answer.body)
        except ValueError as exc:
            raise FetchError(f"bad response: not JSON ({exc})") from exc
