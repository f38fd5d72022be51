"""The node daemon: build every part, open them in order, serve until told to stop, close
them in reverse.

Order (node.assembly): a free port, bound -> secrets -> WAL (recovery) -> health -> the served
components (node.parts: record stores, sync, jobs, actors, locks, runs, weights, backup, audit,
dashboard, the CRL route) -> HTTP -> membership -> election -> discovery -> background sync ->
auto-stop -> the CRL spread's loops; then READY=1. Stop: leave the cluster, then close in
reverse.
"""

from __future__ import annotations

import asyncio
import logging
import random
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from aiohttp import web

from config import NodeSettings
from config.closing import AsyncClosing
from net import peer_url
from node.assembly import Hooks, NodeParts, build_node, resolve_node
from node.component import Component, checks_of, enter
from node.election.service import ElectionService
from node.identity import CrlSpread
from node.logs import QuietProtocolLog
from node.membership.keyring import GossipKeys
from node.membership.service import Membership
from node.runtime import NodeRuntime
from node.startup import check_port_free, listen_sockets
from node.sync_service import SyncService
from node.systemd import SystemdNotifier

if TYPE_CHECKING:
    from config.tls import TlsContexts

log = logging.getLogger(__name__)


class NodeDaemon(AsyncClosing):
    """One running node. `async with NodeDaemon(settings) as daemon:` starts it; exit stops it."""

    def __init__(self, settings: NodeSettings, *, rng: random.Random | None = None) -> None:
        self.settings = settings
        self._rng = rng or random.Random()
        self._stack = AsyncExitStack()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._notifier = SystemdNotifier()
        self.runtime: NodeRuntime | None = None
        self._known_nodes: frozenset[str] = frozenset()
        self.port: int = settings.port
        self.http_app: web.Application | None = None
        """The HTTP API's application once started (its router and route docs)."""
        self._membership: Membership | None = None
        self.election: ElectionService | None = None
        self.sync_service: SyncService | None = None
        self.components: tuple[Component, ...] = ()
        """The served components in start order once started: the app's routes and docs."""
        self.gossip_keys: GossipKeys | None = None
        """The gossip keyring sealing membership datagrams (None: no secret and no keyring)."""
        self._closed = False
        self.stop_requested = asyncio.Event()
        """Set when the node stops itself (auto-stop of a `local` node); `shoal serve` exits."""
        self.stop_reason: str | None = None
        self._protocol_log = QuietProtocolLog(logging.getLogger("aiohttp.server"))
        self.tls: TlsContexts | None = None
        """The TLS contexts (auth tls or hmac+tls): `client_context()` for peer calls."""
        self.crl_spread: CrlSpread | None = None
        self._parts: NodeParts | None = None

    async def start(self) -> None:
        """Start every component in order; on failure, stop what started and re-raise."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _enter(self) -> None:
        await self.start()

    async def _start(self) -> None:
        check_port_free(self.settings.bind, self.settings.port)  # before any store or log line
        resolved = resolve_node(self.settings)
        self.settings, self.gossip_keys, self.tls = (
            resolved.settings,
            resolved.gossip_keys,
            resolved.tls,
        )
        self._known_nodes = resolved.known_nodes
        sockets = listen_sockets(self.settings.bind, self.settings.port)
        try:
            hooks = Hooks(
                leave=self._leave_cluster,
                request_stop=self._request_stop,
                known_node=self._known_node,
                protocol_log=self._protocol_log,
                rng=self._rng,
            )
            parts = build_node(resolved, sockets, hooks)
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        self.runtime, self.port = parts.runtime, parts.runtime.port
        self._membership, self.election = parts.membership, parts.election
        self.sync_service, self.components = parts.served.sync, parts.served.components
        self.crl_spread = parts.served.crl
        self._parts = parts
        self._notifier.status("opening the WAL and the components")
        await enter(self._stack, parts.components)
        self.http_app = parts.api.app
        await self._check_once(parts.runtime, parts.components)
        self._spawn(self._notifier.watchdog_loop(), "systemd-watchdog")
        where = peer_url(self.settings.bind, self.port, tls=self.tls is not None)
        self._notifier.ready(f"serving {parts.runtime.node_id} on {self.settings.bind}:{self.port}")
        log.info("node %s serving on %s", parts.runtime.node_id, where)

    async def _check_once(self, runtime: NodeRuntime, components: tuple[Component, ...]) -> None:
        """The components' health checks join the node's checker (HealthConfigError names one
        registered twice), and each runs once: never "not checked yet" once serving."""
        health = runtime.health
        assert health is not None, "health is built with the runtime"
        checks = checks_of(components)
        for name, check in checks.items():
            health.add_check(name, check.fn, interval_s=check.interval_s)
        for name in checks:
            await health.run_check(name)

    def _known_node(self, sender: str) -> bool:
        """Whether `sender` is this node, a voter or inventory host, or in the membership view
        (any state: a peer marked dead that is back must be heard)."""
        if sender in self._known_nodes:
            return True
        membership = self._membership
        return membership is not None and any(m.node_id == sender for m in membership.members())

    async def _leave_cluster(self) -> None:
        """Gossip this node's leave (peers mark it `left` at once); close() stops the rest."""
        if self._membership is not None:
            await self._membership.leave(timeout_s=1.0)

    def _request_stop(self, reason: str) -> None:
        log.warning("stopping this node: %s", reason)
        self.stop_reason = reason
        self.stop_requested.set()

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Leave the cluster, stop every component in reverse order. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._notifier.stopping()
        if self._membership is not None:
            try:
                await self._membership.leave(timeout_s=1.0)
            except Exception as exc:  # leaving is best effort; peers will detect us anyway
                log.warning("announcing leave failed: %s", exc)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self._stack.aclose()
        finally:
            if self._parts is not None:
                self._parts.release()
