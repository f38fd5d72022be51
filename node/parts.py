"""The components a daemon serves, in start order: the core routes, record stores, sync, jobs,
actors, locks, GPU quarantine, runs, checkpoints, the weights plane and the rollout backlog,
backup, audit, the election's routes, training (launcher, progress, restarts) and the dashboard.
The HTTP app and its OpenAPI document are built from this one list."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

from config import Inventory, StackEntry
from health import DiskWrites
from node.audit import AuditRoutes
from node.backup import BackupService
from node.boot import Secrets, extra_record_schemas
from node.checkpoints.component import CheckpointApi, checkpoint_api
from node.component import Check, Component, Endpoint, Served, loop_check
from node.election.routes import ElectionRoutes
from node.election.seams import WalDurableState
from node.election.service import ElectionService
from node.identity import CertificateGate, CrlSpread
from node.identity.component import api_identity
from node.jobs.component import JobApi, job_api
from node.keyring.routes import KeyringRoutes
from node.locks.component import LockApi, lock_api
from node.locks.service import LockService
from node.membership.keyring import GossipKeys
from node.metrics import ServedMetrics, SyncMetrics
from node.providers.own import AutostopPart
from node.quarantine.component import GpuQuarantine
from node.records import RecordsComponent
from node.rl.backlog import RolloutBacklog
from node.rl.component import weights_service
from node.rl.routes import BacklogRoutes, WeightsRoutes
from node.routes import NO_STATUS_PARTS, CoreRoutes
from node.runs.component import RunApi
from node.runs.nodes import NodeStarter
from node.runs.results import open_results_store
from node.runs.service import RunService
from node.runtime import NodeRuntime, StatusParts
from node.sync_service import SyncService
from node.tasks.registry import open_actor_routes
from node.training.component import TrainingComponent
from node.ui import Dashboard, UiAccess, UiSources
from sync import ROLLOUTS_SCHEMA, RecordStores
from wal import WriteAheadLog


class SyncComponent:
    """The sync service as a component: opened over the WAL and the record stores (it resumes
    the transfers the WAL says were cut off), its loop's health as the `sync` check."""

    def __init__(self, service: SyncService, wal: WriteAheadLog, stores: RecordStores) -> None:
        self.service = service
        self._wal = wal
        self._stores = stores

    async def open(self) -> None:
        try:
            await self.service.open(self._wal, self._stores)
        except BaseException:
            await self.service.close()
            raise

    def routes(self) -> list[Endpoint]:
        return self.service.routes()

    def checks(self) -> Mapping[str, Check]:
        return loop_check(self.service.loop_health)

    async def close(self) -> None:
        await self.service.close()


@dataclass(frozen=True)
class ServedParts:
    """The served components in start order, and the handles the daemon keeps of some."""

    components: tuple[Component, ...]
    """What the daemon enters in order; the app's routes and docs are theirs."""
    sync: SyncService
    jobs: JobApi
    locks: LockService
    dashboard: Dashboard
    training: TrainingComponent
    identity: CertificateGate | None = None
    """The API's certificate and role checks (auth tls or hmac+tls), else None."""
    crl: CrlSpread | None = None
    """The CRL spread (with TLS): its route is served, its loops start once the API listens
    (node.lifecycle.CrlLoops)."""
    autostop: AutostopPart | None = None
    """Auto-stop over the jobs and locks, opened once membership runs (node.assembly)."""
    status: StatusParts = NO_STATUS_PARTS
    """The status document's parts of the jobs, auto-stop and training."""


def sync_service(
    runtime: NodeRuntime,
    secrets: Secrets,
    election: ElectionService,
    inventory: Inventory | None,
    metrics: SyncMetrics | None = None,
) -> SyncService:
    """The sync service, its pushes fenced by the plan this node holds."""
    return SyncService(
        runtime,
        secrets.cluster,
        runtime.settings.sync_interval_s,
        inventory,
        fence=election.plan_fence,
        metrics=metrics,
    )


@dataclass(frozen=True, kw_only=True)
class PartsInputs:
    """What the served components are made of, resolved by the daemon before they start."""

    runtime: NodeRuntime
    secrets: Secrets
    election: ElectionService
    inventory: Inventory | None
    voters: tuple[str, ...]
    stacks: Mapping[str, StackEntry]
    run_nodes: NodeStarter
    writes: DiskWrites
    metrics: ServedMetrics | None = None
    """The node's HTTP and sync series (node.metrics.served_metrics); None: not counted."""
    gossip_keys: GossipKeys | None = None
    leave: Callable[[], Awaitable[None]] | None = None
    """Gossip this node's leave (`shoal node leave`); None: the route answers 503."""
    request_stop: Callable[[str], None] | None = None
    """Stop this daemon, naming why (after a leave)."""


def served_parts(inputs: PartsInputs) -> ServedParts:
    """Every served component of a node, not opened yet, in start order."""
    runtime, secret, election = inputs.runtime, inputs.secrets.cluster, inputs.election
    wal = runtime.wal
    assert wal is not None, "the WAL opens before the served components"
    records, sync, backlog = _records_and_sync(inputs)
    jobs = job_api(runtime, election, wal, secret)
    locks = _locks(inputs, wal)
    quarantine = _gpu_quarantine(runtime, locks.service, election)
    runs = _run_api(inputs, locks.service)
    checkpoints = checkpoint_api(runtime, locks.service, sync, inputs.inventory)
    training = _training(runtime, election, secret, locks, checkpoints)
    weights = weights_service(runtime, election)
    autostop = AutostopPart(
        runtime,
        inputs.inventory,
        lambda: _busy(jobs),
        locks.service,
        inputs.request_stop or _no_stop,
    )
    status = StatusParts(jobs.service.summary, autostop.status, training.status)
    sources = UiSources(runtime, election.plan, jobs.service, sync, weights, backlog, locks.service)
    dashboard = _dashboard(inputs, sources, training, status)
    components: tuple[Component, ...] = (
        CoreRoutes(status),
        records,
        SyncComponent(sync, wal, records.stores),
        jobs,
        open_actor_routes(runtime, election, secret),
        locks,
        quarantine,
        runs,
        checkpoints,
        Served(WeightsRoutes(weights), BacklogRoutes(backlog)),
        Served(BackupService(runtime, records.stores.paths, lambda: sync.catalog)),
        Served(AuditRoutes(runtime)),
        KeyringRoutes(runtime, inputs.gossip_keys, secret),
        Served(ElectionRoutes(lambda: election.elector), election),
        training,
        dashboard,
    )
    identity, crl = api_identity(runtime, runtime.tls, election.plan_fence)
    last = () if crl is None else (Served(crl),)
    served = (*components, *last)
    return ServedParts(
        served, sync, jobs, locks.service, dashboard, training, identity, crl, autostop, status
    )


def _locks(inputs: PartsInputs, wal: WriteAheadLog) -> LockApi:
    """The lock service and its routes over this node's WAL, fenced by the election."""
    return lock_api(
        inputs.runtime,
        inputs.voters,
        WalDurableState(wal),
        inputs.secrets.cluster,
        inputs.election,
        inputs.leave or _no_leave,
        inputs.request_stop or _no_stop,
    )


def _dashboard(
    inputs: PartsInputs, sources: UiSources, training: TrainingComponent, status: StatusParts
) -> Dashboard:
    """The dashboard over `sources` and training, its status page with the status parts, its
    calls to other members signed with the cluster secret."""
    secret = inputs.secrets.cluster
    sources = replace(sources, secret=secret, training=training, status=status)
    return Dashboard(UiAccess(inputs.secrets.ui_token, api_open=secret is None), sources)


def _busy(jobs: JobApi) -> int:
    """Jobs running or about to (auto-stop's idle check)."""
    counts = jobs.service.summary()
    return counts["running"] + counts["pending"]


def _records_and_sync(
    inputs: PartsInputs,
) -> tuple[RecordsComponent, SyncService, RolloutBacklog]:
    """The record stores (each ingest counted in the node's series), the sync service, and the
    rollouts' backlog that admits their POSTs."""
    runtime, series = inputs.runtime, inputs.metrics
    backlog = RolloutBacklog(
        runtime.settings.rollouts_max_pending,
        lambda: records.stores.get(ROLLOUTS_SCHEMA.name),
        registry=runtime.metrics.registry if runtime.metrics is not None else None,
    )
    records = RecordsComponent(
        runtime,
        extra_record_schemas(runtime.settings),
        backlog,
        inputs.writes,
        on_ingest=None if series is None else series.ingest_counter(),
    )
    sync = sync_service(
        runtime,
        inputs.secrets,
        inputs.election,
        inputs.inventory,
        None if series is None else series.sync,
    )
    return records, sync, backlog


def _run_api(inputs: PartsInputs, locks: LockService) -> RunApi:
    """The run queue's routes over the lock table, with the inventory's stacks."""
    stacks = {name: entry.model_dump() for name, entry in inputs.stacks.items()}
    results = open_results_store(inputs.runtime.settings)
    return RunApi(RunService(locks, results, stacks, starter=inputs.run_nodes))


def _training(
    runtime: NodeRuntime,
    election: ElectionService,
    secret: bytes | None,
    locks: LockApi,
    checkpoints: CheckpointApi,
) -> TrainingComponent:
    """The training component: it drains a straggler's node through the locks, and shows the
    committed checkpoint and each node's last restore."""
    training = TrainingComponent(runtime, election, secret)
    training.drain = lambda node, why: locks.nodes.drain(node, None, why)
    training.committed = checkpoints.committed
    training.node_parts["last_restore"] = checkpoints.last_restore
    return training


def _gpu_quarantine(
    runtime: NodeRuntime, locks: LockService, election: ElectionService
) -> GpuQuarantine:
    """The GPU quarantine of this node: its fault watcher, its reports to the coordinator."""
    assert runtime.gpu_reader is not None, "health (and its GPU reader) opens before the parts"
    return GpuQuarantine(runtime, locks, election.plan, runtime.gpu_reader)


async def _no_leave() -> None:
    raise RuntimeError("this node cannot leave: it was built without a daemon")


def _no_stop(reason: str) -> None:
    raise RuntimeError(f"this node cannot stop itself ({reason}): it was built without a daemon")
