"""What a node resolves before it starts: its secrets, node id, address and cluster name, every
peer's breaker config, the record stores it serves and the membership meta of its GPUs."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from config import (
    ConfigError,
    Inventory,
    NodeSettings,
    load_or_create_node_id,
    owned_gpus,
    read_secret_file,
    training_nproc_for,
)
from health import (
    BreakerConfig,
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
from node.addresses import find_self_in_inventory, local_addresses
from node.component import Check, Endpoint
from node.election.claims import gpu_uuids_meta
from node.election.roles import NPROC_META
from node.membership.service import MetaValue
from node.runtime import GpuList
from node.ui import load_ui_token
from sync import BUILTIN_SCHEMAS, RecordSchema, RecordSchemaError, schema_from_mapping
from wal import WriteAheadLog

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


@dataclass(frozen=True)
class HostHealth:
    """The node's health checker and GPU reader, and the GPUs it owns: what the runtime is
    built with, and the GPU part of the membership meta. As a component it runs the checker's
    loop from `open()` to `close()`, then closes the GPU reader."""

    checker: HealthChecker
    reader: GpuReader
    gpus: GpuList
    owned: tuple[int, ...]
    training_nproc: int
    gpu_meta: dict[str, MetaValue]

    async def open(self) -> None:
        await self.checker.start()

    def routes(self) -> Sequence[Endpoint]:
        return ()

    def checks(self) -> Mapping[str, Check]:
        return {}  # its own (disk, WAL, memory, GPU) are on the checker already

    async def close(self) -> None:
        try:
            await self.checker.close()
        finally:
            self.reader.close()


def host_health(
    settings: NodeSettings,
    wal: WriteAheadLog,
    metrics: NodeMetrics,
    writes: DiskWrites,
) -> HostHealth:
    """Health checks (disk, WAL, memory, GPU) and their metrics, not started; resolves the GPUs
    this node owns (`gpus`, `training_nproc`: ConfigError when they do not fit the host)."""
    checker = HealthChecker(timeouts=settings.timeouts)
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
    try:
        checker.add_check("gpu", gpu_check(reader), interval_s=30.0)
        gpus = reader.read()
        owned = owned_gpus(settings.gpus, len(gpus))
        nproc = training_nproc_for(settings.training_nproc, owned)
    except BaseException:
        reader.close()
        raise
    meta = gpu_meta([gpus[index] for index in owned], nproc)
    checker.add_listener(metrics.record_health)
    return HostHealth(
        checker, reader, lambda: [gpu.to_json() for gpu in reader.read()], owned, nproc, meta
    )
