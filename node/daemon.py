"""The node daemon: start components in order, serve until told to stop, stop in reverse.

Order: a free port -> secrets -> WAL (recovery) -> health -> the served components (node.parts:
record stores, sync, jobs, actors, locks, runs, weights, backup, audit, dashboard, the CRL
spread) -> HTTP -> membership -> election -> discovery -> auto-stop; then READY=1. Stop in
reverse: auto-stop, discovery, election, membership, HTTP (the dashboard's event streams
first), the served components, health, WAL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from aiohttp import web

from config import (
    PROTOCOL_META,
    PROTOCOL_VERSION,
    RELEASE_META,
    Inventory,
    NodeSettings,
    load_inventory,
    shoal_version,
)
from config.closing import AsyncClosing
from config.tls import serial_text
from health import (
    BreakerRegistry,
    DiskWrites,
    NodeMetrics,
)
from net import peer_url
from node.boot import (
    Secrets,
    advertise_address,
    breaker_config,
    inventory_cluster_name,
    load_secrets,
    open_health,
    resolve_node_id,
)
from node.component import LOOP_CHECK_INTERVAL_S, Check, Component, checks_of, enter
from node.discovery.feed import Discovery
from node.discovery.start import open_discovery
from node.election.service import ElectionService, resolve_voters
from node.errors import KeyringError, StartupError
from node.identity import (
    AUTH_META,
    CERT_META,
    CrlSpread,
    open_tls,
)
from node.identity.component import api_site
from node.jobs.component import JobApi
from node.logs import QuietProtocolLog
from node.membership.checks import membership_check
from node.membership.keyring import GossipKeys
from node.membership.service import Membership, MetaValue, UdpMembershipTransport
from node.metrics import ServedMetrics, served_metrics
from node.parts import PartsInputs, ServedParts, served_parts
from node.providers import StaticProvider
from node.providers.own import open_autostop
from node.routes import build_app
from node.runs.nodes import ProviderNodes, StaticNodes
from node.runtime import NodeRuntime
from node.security import AuthPolicy
from node.signers import node_bound
from node.startup import check_port_free, prepare_data_dir
from node.sync_service import SyncService
from node.systemd import SystemdNotifier
from wal import WalConfig, WriteAheadLog

if TYPE_CHECKING:
    from config.tls import TlsContexts

log = logging.getLogger(__name__)


MAX_REQUEST_LINE_BYTES = 256 * 1024
DISCOVERY_REFEED_S = 3.0
"""How often inventory hosts and seeds are offered to membership again (a seed that started
after us is found within this time; each offer costs at most a few datagrams per host)."""


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
        self._membership: Any = None
        self.sync_service: SyncService | None = None
        self._gpu_meta: dict[str, MetaValue] = {}
        self.components: tuple[Component, ...] = ()
        """The served components in start order once started: the app's routes and docs."""
        self._checks: list[str] = []
        """The health checks the components contributed, run once before READY."""
        self.gossip_keys: GossipKeys | None = None
        """The gossip keyring sealing membership datagrams (None: no secret and no keyring)."""
        self._disk_writes = DiskWrites()
        self._series: ServedMetrics | None = None
        self._closed = False
        self.stop_requested = asyncio.Event()
        """Set when the node stops itself (auto-stop of a `local` node); `shoal serve` exits."""
        self.stop_reason: str | None = None
        self._protocol_log = QuietProtocolLog(logging.getLogger("aiohttp.server"))
        self.tls: TlsContexts | None = None
        """The TLS contexts (auth tls or hmac+tls): `client_context()` for peer calls."""
        self.crl_spread: CrlSpread | None = None

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
        inventory, secrets, node_id, breakers, metrics = self._resolve()
        settings = self.settings
        self._notifier.status("opening the WAL")
        wal_config = WalConfig.from_timeouts(settings.timeouts)
        wal = WriteAheadLog(settings.wal_path, config=wal_config, observer=metrics)
        await self._stack.enter_async_context(wal)
        pending = await wal.pending()
        if pending:
            log.warning("WAL %s holds %d pending operations", settings.wal_path, len(pending))
        host = await open_health(self._stack, settings, wal, metrics, self._disk_writes)
        self._gpu_meta = host.gpu_meta
        runtime = NodeRuntime(
            settings=settings,
            node_id=node_id,
            address=advertise_address(settings),
            version=shoal_version(),
            breakers=breakers,
            wal=wal,
            health=host.checker,
            metrics=metrics,
            gpus=host.gpus,
            owned_gpus=host.owned,
            training_nproc=host.training_nproc,
            gpu_reader=host.reader,
            tls=self.tls,
        )
        self.runtime = runtime
        self._series = served_metrics(runtime)
        self._election = ElectionService(runtime, self._voters)
        self._notifier.status("resuming interrupted transfers")
        parts = served_parts(
            PartsInputs(
                runtime,
                secrets,
                self._election,
                inventory,
                self._voters.voters,
                {} if inventory is None else inventory.stacks,
                self._run_nodes,
                self._disk_writes,
                metrics=self._series,
                gossip_keys=self.gossip_keys,
                leave=self._leave_cluster,
                request_stop=self._request_stop,
            )
        )
        self.sync_service, self.components = parts.sync, parts.components
        self.crl_spread = parts.crl
        await enter(self._stack, parts.components)
        self._add_checks(runtime, checks_of(parts.components))
        await self._serve(runtime, secrets, parts)
        await self._start_cluster(runtime, secrets, inventory, parts)
        self._spawn(parts.sync.run_forever(), "background-sync")
        self._spawn(self._notifier.watchdog_loop(), "systemd-watchdog")
        self._notifier.ready(f"serving {runtime.node_id} on {settings.bind}:{self.port}")
        where = peer_url(settings.bind, self.port, tls=self.tls is not None)
        log.info("node %s serving on %s", runtime.node_id, where)

    def _resolve(
        self,
    ) -> tuple[Inventory | None, Secrets, str, BreakerRegistry, NodeMetrics]:
        """The settings, secrets, inventory, identity, breakers, metrics and voters of this
        node, before anything opens."""
        settings = self.settings
        secrets = load_secrets(settings)
        inventory = load_inventory(settings.inventory) if settings.inventory else None
        settings = self.settings = inventory_cluster_name(settings, inventory)
        prepare_data_dir(settings.data_dir)
        try:
            self.gossip_keys = GossipKeys.open(
                settings.data_dir, secret=secrets.cluster, cluster=settings.cluster_name
            )
        except KeyringError as exc:
            raise StartupError(f"gossip keyring: {exc}") from exc
        node_id = resolve_node_id(settings, inventory)
        self.tls = open_tls(settings, node_id)
        breakers = BreakerRegistry(breaker_config(settings, inventory))
        metrics = NodeMetrics(node_id, shoal_version())
        metrics.bind_breakers(breakers)
        self._voters = resolve_voters(settings, inventory, node_id)
        self._known_nodes = frozenset(
            {node_id, *self._voters.voters, *(() if inventory is None else inventory.hosts)}
        )
        self._run_nodes = (
            StaticNodes() if inventory is None else ProviderNodes(StaticProvider(inventory))
        )
        return inventory, secrets, node_id, breakers, metrics

    async def _start_cluster(
        self,
        runtime: NodeRuntime,
        secrets: Secrets,
        inventory: Inventory | None,
        parts: ServedParts,
    ) -> None:
        """Membership, the election, discovery and auto-stop, once the HTTP API serves; every
        health check has run once when this returns."""
        membership = await self._start_membership(runtime, secrets)
        self._notifier.status("joining the election")
        election, wal = self._election, runtime.wal
        assert wal is not None
        elector = await election.start(membership, inventory, secrets.cluster, wal, self._rng)
        self._stack.push_async_callback(election.close)
        discovery = await self._start_discovery(runtime, membership, inventory)
        jobs = parts.jobs
        autostop = await open_autostop(
            runtime, inventory, lambda: self._busy_jobs(jobs), parts.locks, self._request_stop
        )
        if autostop is not None:
            self._stack.push_async_callback(autostop.close)
        parts.sync.attach(membership)
        checks = {
            loop.name: Check(loop.check, interval_s=LOOP_CHECK_INTERVAL_S)
            for loop in (elector.loop_health, discovery.loop_health)
        }
        checks["membership"] = Check(membership_check(membership), interval_s=5.0)
        self._add_checks(runtime, checks)
        health = runtime.health
        assert health is not None
        for name in self._checks:  # never "not checked yet" once serving
            await health.run_check(name)

    def _add_checks(self, runtime: NodeRuntime, checks: Mapping[str, Check]) -> None:
        """`checks` join the node's checker (HealthConfigError names one registered twice)."""
        assert runtime.health is not None, "health opens before the components"
        for name, check in checks.items():
            runtime.health.add_check(name, check.fn, interval_s=check.interval_s)
            self._checks.append(name)

    def _known_node(self, sender: str) -> bool:
        """Whether `sender` is this node, a voter or inventory host, or in the membership view
        (any state: a peer marked dead that is back must be heard)."""
        if sender in self._known_nodes:
            return True
        membership = None if self.runtime is None else self.runtime.membership
        return membership is not None and any(m.node_id == sender for m in membership.members())

    async def _serve(self, runtime: NodeRuntime, secrets: Secrets, parts: ServedParts) -> None:
        """The HTTP API: one app whose routes and OpenAPI document are the components' routes,
        listening on the configured address (port 0: any free port, then `self.port`)."""
        policy = AuthPolicy(
            secret=secrets.cluster,
            metrics_token=secrets.metrics_token,
            skew_s=runtime.settings.timeouts.auth_skew_s,
            known_node=self._known_node,
            cluster=runtime.settings.cluster_name,
            **node_bound(runtime),
        )
        identity, crl = parts.identity, parts.crl
        app = build_app(
            runtime,
            policy,
            self.components,
            gates=[parts.dashboard.middleware],
            identity=identity,
            fence=self._election.plan_fence,
            http_metrics=None if self._series is None else self._series.http,
        )
        self.http_app = app
        runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=2.0,
            # GET /v1/records/{store}/get takes up to 1000 keys in its query string.
            max_line_size=MAX_REQUEST_LINE_BYTES,
            logger=self._protocol_log,
        )
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        self._stack.push_async_callback(parts.dashboard.close)  # open event streams end first
        site = api_site(runner, runtime.settings, identity)
        try:
            await site.start()
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {runtime.settings.bind}:{runtime.settings.port}: "
                f"{os.strerror(exc.errno) if exc.errno else exc}; is another shoal running? "
                "choose another --port"
            ) from exc
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        runtime.port = self.port
        if crl is not None:
            crl.start()

    async def _start_membership(self, runtime: NodeRuntime, secrets: Secrets) -> Membership:
        """Membership over UDP on the API's port number, fed by discovery."""
        settings = runtime.settings
        meta: dict[str, MetaValue] = {
            RELEASE_META: runtime.version,
            PROTOCOL_META: PROTOCOL_VERSION,
            "role": settings.role.value,
            "cluster": settings.cluster_name,
            "config_hash": settings.config_hash(),
            **self._gpu_meta,
        }
        if self.tls is not None:
            meta[AUTH_META] = settings.auth_mode.value
            meta[CERT_META] = serial_text(self.tls.material.own.serial)
        transport = UdpMembershipTransport(
            settings.bind,
            self.port,
            secret=secrets.cluster,
            cluster=settings.cluster_name,
            max_skew_s=settings.timeouts.auth_skew_s,
            keys=self.gossip_keys,
        )
        membership = Membership(
            runtime.node_id,
            runtime.address,
            self.port,
            meta,
            transport,
            settings.timeouts,
            cluster=settings.cluster_name,
            rng=self._rng,
        )
        await self._stack.enter_async_context(membership)
        self._membership = membership
        runtime.membership = membership
        return membership

    async def _start_discovery(
        self, runtime: NodeRuntime, membership: Membership, inventory: Inventory | None
    ) -> Discovery:
        """mDNS, inventory and seeds feed candidates to membership."""
        return await open_discovery(
            self._stack,
            runtime,
            self.port,
            lambda candidate: membership.add_candidate(candidate.address, candidate.port),
            inventory,
            DISCOVERY_REFEED_S,
        )

    @staticmethod
    def _busy_jobs(jobs: JobApi) -> int:
        counts = jobs.service.summary()
        return counts["running"] + counts["pending"]

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
        await self._stack.aclose()
