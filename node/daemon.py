"""The node daemon: start components in order, serve until told to stop, stop in reverse.

Order: secrets -> WAL (recovery) -> health -> record stores and HTTP -> membership -> discovery;
then READY=1. Stop in reverse: leave, discovery, membership, HTTP, stores, health, WAL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import random
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ifaddr
from aiohttp import web

from config import (
    ConfigError,
    Inventory,
    NodeSettings,
    load_inventory,
    load_or_create_node_id,
    owned_gpus,
    read_secret_file,
    shoal_version,
    training_nproc_for,
)
from health import (
    BreakerConfig,
    BreakerRegistry,
    CheckFn,
    CheckResult,
    DiskWrites,
    GpuInfo,
    GpuReader,
    HealthChecker,
    HealthStatus,
    NodeMetrics,
    disk_check,
    gpu_check,
    memory_check,
    wal_backlog_check,
    wal_check,
)
from node.addresses import choose_interfaces, find_self_in_inventory, local_addresses
from node.audit import AuditRoutes
from node.backup import BackupService
from node.discovery.candidates import Advert
from node.discovery.feed import Discovery
from node.election.claims import gpu_uuids_meta
from node.election.roles import NPROC_META
from node.election.seams import WalDurableState
from node.election.service import ElectionService, resolve_voters
from node.errors import DiscoveryError, StartupError
from node.identity import (
    AUTH_META,
    CertificateGate,
    CrlSpread,
    IdentitySite,
    crl_route_docs,
    open_tls,
)
from node.jobs.component import JobApi, open_job_service
from node.locks.service import LockService
from node.logs import QuietProtocolLog
from node.membership.service import Membership, MetaValue, UdpMembershipTransport
from node.metrics import ingest_counter
from node.openapi import RouteDoc
from node.providers import StaticProvider
from node.providers.own import open_autostop
from node.rl.backlog import RolloutBacklog
from node.rl.service import WeightsService
from node.routes import build_app
from node.runs.nodes import ProviderNodes, StaticNodes
from node.runs.results import open_results_store
from node.runs.service import RunService
from node.runtime import NodeRuntime
from node.security import AuthPolicy
from node.startup import prepare_data_dir
from node.sync_service import SyncService
from node.systemd import SystemdNotifier
from node.tasks.registry import open_actor_routes
from node.ui import Dashboard, UiAccess, UiSources, load_ui_token

if TYPE_CHECKING:
    from config.tls import TlsContexts
from sync import (
    BUILTIN_SCHEMAS,
    ROLLOUTS_SCHEMA,
    RecordSchema,
    RecordSchemaError,
    RecordStores,
    record_route_docs,
    record_routes,
    schema_from_mapping,
)
from wal import WalConfig, WriteAheadLog

log = logging.getLogger(__name__)


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Secrets:
    cluster: bytes | None
    metrics_token: bytes | None
    ui_token: bytes | None = None
    """The dashboard's read token (ui_token_file)."""


def load_secrets(settings: NodeSettings) -> Secrets:
    """Read the secret files and refuse a non-loopback bind without a secret (unless insecure)."""
    cluster = read_secret_file(settings.secret_file) if settings.secret_file else None
    token = None
    if settings.metrics_token_file is not None:
        token = read_secret_file(settings.metrics_token_file, "metrics token file")
    if cluster is None and not is_loopback(settings.bind):
        if not settings.insecure:
            raise ConfigError(
                f"bind {settings.bind}: refusing to serve beyond loopback without a cluster "
                "secret; pass --secret-file FILE (chmod 600), bind 127.0.0.1, or --insecure"
            )
        log.warning(
            "serving on %s WITHOUT authentication (--insecure): anyone who reaches this "
            "port can read status and data",
            settings.bind,
        )
    return Secrets(cluster, token, load_ui_token(settings.ui_token_file))


def breaker_config(settings: NodeSettings, inventory: Inventory | None) -> BreakerConfig:
    """Every peer's breaker: the timeout table, then the inventory's `circuit_breaker` section;
    a threshold set in the config file, environment or flags (SHOAL_CIRCUIT_THRESHOLD) wins."""
    config = BreakerConfig.from_timeouts(settings.timeouts, settings.circuit_threshold)
    if inventory is None:
        return config
    section = inventory.circuit_breaker
    threshold = (
        settings.circuit_threshold
        if "circuit_threshold" in settings.model_fields_set
        else section.failure_threshold
    )
    return dataclasses.replace(
        config, failure_threshold=threshold, recovery_timeout_s=section.recovery_timeout
    )


def extra_record_schemas(settings: NodeSettings) -> list[RecordSchema]:
    """The record stores the config declares beside games and rollouts."""
    schemas = []
    for name, declaration in sorted(settings.record_stores.items()):
        try:
            schemas.append(schema_from_mapping(name, declaration))
        except RecordSchemaError as exc:
            raise ConfigError(f"record_stores.{name}: {exc}") from exc
    return schemas


def record_schemas(settings: NodeSettings) -> list[RecordSchema]:
    """Every record store's schema: the built-in ones and those the config declares."""
    return [*BUILTIN_SCHEMAS.values(), *extra_record_schemas(settings)]


def inventory_cluster_name(settings: NodeSettings, inventory: Inventory | None) -> NodeSettings:
    """The settings with the inventory's `cluster.name` when the settings keep the default. A
    node whose cluster id stays the default while mDNS is on is warned: another cluster of the
    default name on its network would be taken as its own."""
    default = NodeSettings.model_fields["cluster_name"].default
    named = settings
    if inventory is not None and inventory.cluster.name != settings.cluster_name:
        if settings.cluster_name != default:
            log.warning(
                "cluster_name %r (settings) differs from %r in the inventory %s; using the "
                "settings'",
                settings.cluster_name,
                inventory.cluster.name,
                inventory.source,
            )
        else:
            named = settings.model_copy(update={"cluster_name": inventory.cluster.name})
    if named.mdns and named.cluster_name == default:
        log.warning(
            "the cluster id is the default %r and mDNS is on: another cluster of that name on "
            "this network would join this one; name it (inventory cluster.name or cluster_name)",
            default,
        )
    return named


def resolve_node_id(settings: NodeSettings, inventory: Inventory | None) -> str:
    """Explicit id, else this host's inventory entry (matched by address), else the data dir's."""
    if settings.node_id:
        return settings.node_id
    if inventory is not None:
        found = find_self_in_inventory(inventory, local_addresses(), settings.port)
        if found is not None:
            return found
    return load_or_create_node_id(settings.data_dir)


def advertise_address(settings: NodeSettings) -> str:
    """The address peers reach this node at."""
    if settings.advertise_address:
        return settings.advertise_address
    if settings.bind not in ("0.0.0.0", "::", ""):  # noqa: S104 - comparing, not binding
        return settings.bind
    candidates = [a for a in local_addresses() if not is_loopback(a) and ":" not in a]
    return candidates[0] if candidates else "127.0.0.1"


MAX_REQUEST_LINE_BYTES = 256 * 1024
DISCOVERY_REFEED_S = 3.0
"""How often inventory hosts and seeds are offered to membership again (a seed that started
after us is found within this time; each offer costs at most a few datagrams per host)."""
LOOP_CHECK_INTERVAL_S = 1.0
"""How often the health of the background loops (sync, election, discovery) is read: a
cheap read of what each loop last reported."""


def membership_check(membership: Membership) -> CheckFn:
    """Degraded while this node's own Lifeguard health score says it misses acks or stalls."""

    async def check() -> CheckResult:
        score = membership.local_health
        stalls = membership.stall_count
        dropped = sum(membership.transport_stats().dropped.values())
        metrics = {"local_health": float(score), "stalls": float(stalls), "dropped": float(dropped)}
        if score > 0 or stalls > 0:
            message = (
                f"local health score {score}, {stalls} recent event-loop stalls: this node "
                "is slow to answer probes (CPU starved or blocked loop)"
            )
            return CheckResult(HealthStatus.DEGRADED, message, metrics)
        counts = membership.counts()
        return CheckResult(HealthStatus.HEALTHY, f"{counts.get('alive', 0)} members alive", metrics)

    return check


def gpu_meta(owned: Sequence[GpuInfo], nproc: int) -> dict[str, MetaValue]:
    """The membership meta of the GPUs a node owns and its training processes: gpu_count, gpu,
    gpu_vram_gb, the UUIDs (node.election.claims.gpu_uuids_meta) and training_nproc."""
    meta: dict[str, MetaValue] = {NPROC_META: nproc}
    if owned:
        meta |= {
            "gpu_count": len(owned),
            "gpu": owned[0].name,
            "gpu_vram_gb": round(max(g.memory_total_mb or 0.0 for g in owned) / 1024, 1),
            **gpu_uuids_meta([gpu.uuid for gpu in owned if gpu.uuid]),
        }
    return meta


class NodeDaemon:
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
        self._disk_writes = DiskWrites()
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

    async def __aenter__(self) -> NodeDaemon:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _start(self) -> None:
        settings = self.settings
        secrets = load_secrets(settings)
        inventory = load_inventory(settings.inventory) if settings.inventory else None
        settings = self.settings = inventory_cluster_name(settings, inventory)
        prepare_data_dir(settings.data_dir)
        node_id = resolve_node_id(settings, inventory)
        self.tls = open_tls(settings, node_id)
        breakers = BreakerRegistry(breaker_config(settings, inventory))
        metrics = NodeMetrics(node_id, shoal_version())
        metrics.bind_breakers(breakers)
        runtime = NodeRuntime(
            settings=settings,
            node_id=node_id,
            address=advertise_address(settings),
            version=shoal_version(),
            breakers=breakers,
            metrics=metrics,
        )
        self.runtime = runtime
        self._voters = resolve_voters(settings, inventory, node_id)
        self._known_nodes = frozenset(
            {node_id, *self._voters.voters, *(() if inventory is None else inventory.hosts)}
        )
        self._stacks = {} if inventory is None else dict(inventory.stacks)
        self._run_nodes = (
            StaticNodes() if inventory is None else ProviderNodes(StaticProvider(inventory))
        )
        election = ElectionService(runtime, self._voters)
        self._election = election
        self._notifier.status("opening the WAL")
        wal_config = WalConfig.from_timeouts(settings.timeouts)
        wal = WriteAheadLog(settings.wal_path, config=wal_config, observer=metrics)
        await self._stack.enter_async_context(wal)
        runtime.wal = wal
        pending = await wal.pending()
        if pending:
            log.warning("WAL %s holds %d pending operations", settings.wal_path, len(pending))
        await self._start_health(runtime, wal)
        stores = RecordStores.for_settings(
            settings, extra_schemas=extra_record_schemas(settings), writes=self._disk_writes
        )
        await self._stack.enter_async_context(stores)
        self._notifier.status("resuming interrupted transfers")
        sync_service = SyncService(
            runtime,
            secrets.cluster,
            settings.sync_interval_s,
            inventory,
            fence=lambda: (
                election.elector.plan.fence
                if election.elector is not None and election.elector.plan is not None
                else None
            ),
        )
        self.sync_service = sync_service
        self._stack.push_async_callback(sync_service.close)
        await sync_service.open(wal, stores)
        jobs = await open_job_service(runtime, election, wal, secrets.cluster)
        self._stack.push_async_callback(jobs.close)
        await self._start_http(runtime, secrets, election, stores, sync_service, jobs)
        membership = await self._start_membership(runtime, secrets)
        self._notifier.status("joining the election")
        elector = await election.start(membership, inventory, secrets.cluster, wal, self._rng)
        self._stack.push_async_callback(election.close)
        discovery = await self._start_discovery(runtime, membership, inventory)
        autostop = await open_autostop(
            runtime, inventory, lambda: self._busy_jobs(jobs), self._locks, self._request_stop
        )
        if autostop is not None:
            self._stack.push_async_callback(autostop.close)
        sync_service.attach(membership)
        assert runtime.health is not None
        for loop in (sync_service.loop_health, elector.loop_health, discovery.loop_health):
            runtime.health.add_check(loop.name, loop.check, interval_s=LOOP_CHECK_INTERVAL_S)
            await runtime.health.run_check(loop.name)  # never "not checked yet" once serving
        self._spawn(sync_service.run_forever(), "background-sync")
        self._spawn(self._notifier.watchdog_loop(), "systemd-watchdog")
        self._notifier.ready(f"serving {node_id} on {settings.bind}:{self.port}")
        scheme = "http" if self.tls is None else "https"
        log.info("node %s serving on %s://%s:%d", node_id, scheme, settings.bind, self.port)

    async def _start_health(self, runtime: NodeRuntime, wal: WriteAheadLog) -> None:
        """Health checks and metrics; resolves the GPUs this node owns (`gpus`,
        `training_nproc`: ConfigError when they do not fit the host) into the runtime and the
        membership meta."""
        settings = runtime.settings
        checker = HealthChecker(timeouts=settings.timeouts)
        writes = self._disk_writes
        checker.add_check("disk", disk_check(settings.data_dir, writes=writes), interval_s=30.0)
        writes.add_listener(
            lambda failure: checker.report(
                "disk", CheckResult(HealthStatus.UNHEALTHY, failure.describe())
            )
        )
        checker.add_check("wal", wal_check(wal), interval_s=15.0)
        checker.add_check("wal_backlog", wal_backlog_check(wal), interval_s=15.0)
        checker.add_check("memory", memory_check(), interval_s=30.0)
        reader = GpuReader()
        self._stack.callback(reader.close)
        checker.add_check("gpu", gpu_check(reader), interval_s=30.0)
        runtime.gpus = lambda: [gpu.to_json() for gpu in reader.read()]
        gpus = reader.read()
        owned = owned_gpus(settings.gpus, len(gpus))
        runtime.owned_gpus = owned
        runtime.training_nproc = training_nproc_for(settings.training_nproc, owned)
        self._gpu_meta = gpu_meta([gpus[index] for index in owned], runtime.training_nproc)
        assert runtime.metrics is not None
        checker.add_listener(runtime.metrics.record_health)
        await self._stack.enter_async_context(checker)
        runtime.health = checker

    def _known_node(self, sender: str) -> bool:
        """Whether `sender` is this node, a voter or inventory host, or in the membership view
        (any state: a peer marked dead that is back must be heard)."""
        if sender in self._known_nodes:
            return True
        membership = None if self.runtime is None else self.runtime.membership
        return membership is not None and any(m.node_id == sender for m in membership.members())

    async def _start_http(
        self,
        runtime: NodeRuntime,
        secrets: Secrets,
        election: ElectionService,
        stores: RecordStores,
        sync_service: SyncService,
        jobs: JobApi,
    ) -> None:
        policy = AuthPolicy(
            secret=secrets.cluster,
            metrics_token=secrets.metrics_token,
            skew_s=runtime.settings.timeouts.auth_skew_s,
            known_node=self._known_node,
            cluster=runtime.settings.cluster_name,
        )
        actors = open_actor_routes(runtime, election, secrets.cluster)
        self._stack.push_async_callback(actors.close)
        # runs: the cluster's fenced locks (node/runs)
        assert runtime.wal is not None
        locks = LockService(
            runtime, self._voters.voters, WalDurableState(runtime.wal), secrets.cluster
        )
        await locks.open()
        self._stack.push_async_callback(locks.close)
        self._locks = locks
        stacks = {name: entry.model_dump() for name, entry in self._stacks.items()}
        results = open_results_store(runtime.settings)
        runs = RunService(locks, results, stacks, starter=self._run_nodes)
        await runs.open()
        self._stack.push_async_callback(runs.close)
        if runtime.health is not None:
            runtime.health.add_check("locks", locks.loop_health.check, interval_s=1.0)
            runtime.health.add_check("runs", runs.loop_health.check, interval_s=1.0)
        weights = self._weights_service(runtime, election)
        backup = BackupService(runtime, stores.paths, lambda: sync_service.catalog)
        audit = AuditRoutes(runtime)
        backlog = RolloutBacklog(
            runtime.settings.rollouts_max_pending,
            lambda: stores.get(ROLLOUTS_SCHEMA.name),
            registry=runtime.metrics.registry if runtime.metrics is not None else None,
        )
        identity, crl = self._identity(runtime, election)
        dashboard = Dashboard(
            UiAccess(secrets.ui_token, api_open=secrets.cluster is None),
            UiSources(
                runtime,
                lambda: election.elector.plan if election.elector is not None else None,
                jobs.service,
                sync_service,
                weights,
                backlog,
                locks,
                secrets.cluster,
            ),
        )
        await dashboard.open()
        self._stack.push_async_callback(dashboard.close)
        app = build_app(
            runtime,
            policy,
            gates=[dashboard.middleware],
            identity=identity,
            extra_routes=[
                *(crl.routes() if crl is not None else ()),
                *dashboard.routes(),
                *record_routes(
                    stores, runtime.node_id, on_ingest=ingest_counter(runtime), gate=backlog
                ),
                *election.routes(),
                *sync_service.routes(),
                *jobs.routes(),
                *actors.routes(),
                *locks.routes(),
                *runs.routes(),
                *weights.routes(),
                *backlog.routes(),
                *backup.routes(),
                *audit.routes(),
            ],
            extra_docs=[
                *(crl_route_docs() if crl is not None else ()),
                *dashboard.docs(),
                *(
                    RouteDoc(**doc)
                    for doc in record_route_docs(
                        record_schemas(runtime.settings), gated=(ROLLOUTS_SCHEMA.name,)
                    )
                ),
                *election.docs(),
                *sync_service.docs([schema.name for schema in record_schemas(runtime.settings)]),
                *jobs.docs(),
                *actors.docs(),
                *locks.docs(),
                *runs.docs(),
                *weights.docs(),
                *backlog.docs(),
                *backup.docs(),
                *audit.docs(),
            ],
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
        self._stack.push_async_callback(dashboard.close)  # open event streams end first
        site = self._site(runner, identity)
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

    def _identity(
        self, runtime: NodeRuntime, election: ElectionService
    ) -> tuple[CertificateGate | None, CrlSpread | None]:
        """With TLS: the certificate and role checks of the API, and the CRL spread."""
        settings = runtime.settings
        if self.tls is None or settings.tls is None:
            return None, None
        gate = CertificateGate(
            self.tls,
            settings.auth_mode,
            lambda: (
                election.elector.plan.fence
                if election.elector is not None and election.elector.plan is not None
                else None
            ),
            runtime.metrics.registry if runtime.metrics is not None else None,
        )
        crl = CrlSpread(runtime, self.tls, settings.tls.crl_refresh_s)
        self.crl_spread = crl
        self._stack.push_async_callback(crl.close)
        return gate, crl

    def _site(self, runner: web.AppRunner, identity: CertificateGate | None) -> web.BaseSite:
        """Plain HTTP (auth hmac), or TLS 1.3 with plain HTTP where the auth mode allows it."""
        settings = self.settings
        if identity is None:
            return web.TCPSite(runner, settings.bind, settings.port)
        return IdentitySite(
            runner,
            settings.bind,
            settings.port,
            contexts=identity.contexts,
            mode=settings.auth_mode,
            plain_ok=settings.secret_file is not None,
            refused=identity.refused,
        )

    def _weights_service(self, runtime: NodeRuntime, election: ElectionService) -> WeightsService:
        """The pipeline-RL weights plane; its group is served at /v1/rendezvous?group=weights."""

        def url_of(node_id: str) -> str | None:
            if node_id == runtime.node_id:
                return f"http://{runtime.address}:{runtime.port}"
            member = self._membership.member(node_id) if self._membership is not None else None
            return None if member is None else f"http://{member.address}:{member.port}"

        weights = WeightsService(
            runtime.node_id,
            lambda: election.elector.plan if election.elector is not None else None,
            url_of,
            runtime.wal,
            runtime.metrics.registry if runtime.metrics is not None else None,
        )
        election.group_handlers["weights"] = weights.rendezvous
        return weights

    async def _start_membership(self, runtime: NodeRuntime, secrets: Secrets) -> Membership:
        """Membership over UDP on the API's port number, fed by discovery."""
        settings = runtime.settings
        meta: dict[str, MetaValue] = {
            "version": runtime.version,
            "role": settings.role.value,
            "cluster": settings.cluster_name,
            "config_hash": settings.config_hash(),
            **self._gpu_meta,
        }
        if self.tls is not None:
            meta[AUTH_META] = settings.auth_mode.value
        transport = UdpMembershipTransport(
            settings.bind,
            self.port,
            secret=secrets.cluster,
            cluster=settings.cluster_name,
            max_skew_s=settings.timeouts.auth_skew_s,
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
        if runtime.health is not None:
            runtime.health.add_check("membership", membership_check(membership), interval_s=5.0)
        return membership

    async def _start_discovery(
        self, runtime: NodeRuntime, membership: Membership, inventory: Inventory | None
    ) -> Discovery:
        """mDNS, inventory and seeds feed candidates to membership."""
        settings = runtime.settings
        advert = Advert(
            node_id=runtime.node_id,
            cluster=settings.cluster_name,
            version=runtime.version,
            port=self.port,
            addresses=(runtime.address,),
        )
        interfaces = choose_interfaces(ifaddr.get_adapters(), None, settings.bind)

        def make_discovery(mdns: bool) -> Discovery:
            return Discovery(
                advert,
                lambda candidate: membership.add_candidate(candidate.address, candidate.port),
                mdns=mdns,
                inventory=inventory,
                seeds=settings.seeds,
                timeouts=settings.timeouts,
                interfaces=interfaces,
                refeed_interval_s=DISCOVERY_REFEED_S,
            )

        try:
            return await self._stack.enter_async_context(make_discovery(settings.mdns))
        except DiscoveryError as exc:
            log.error("mDNS discovery is off, inventory and seeds still work: %s", exc)
            runtime.notes.append(f"mDNS discovery is off: {exc}")
            return await self._stack.enter_async_context(make_discovery(False))

    @staticmethod
    def _busy_jobs(jobs: JobApi) -> int:
        counts = jobs.service.summary()
        return counts["running"] + counts["pending"]

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
