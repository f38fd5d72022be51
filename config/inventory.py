"""The YAML host inventory: schema, loading with clear errors, and host selection."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from config.errors import ConfigError, InventoryError
from config.fields import Category, HostStatus, NodeId, Port, Role
from config.yamlfile import YamlDocument, load_yaml_mapping, validation_problems


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterSection(_Frozen):
    """`cluster:`: the cluster's name and its fixed voter set (default: every host)."""

    name: str = Field("shoal", min_length=1)
    voters: tuple[NodeId, ...] | None = None


class AutostopSection(_Frozen):
    """`autostop:` of a host: stop (or release) it through its provider after this idle window."""

    idle_minutes: float = Field(..., gt=0)
    action: Literal["stop", "release"] = "stop"
    gpu_util_threshold: float = Field(5.0, ge=0, le=100)


class HostEntry(_Frozen):
    """One host of the inventory; its key in `hosts:` is its node id."""

    ssh_host: str | None = None
    tailscale_ip: str | None = None
    ssh_user: str | None = None
    ssh_port: Port = 22
    ssh_key: str | None = None
    proxy_jump: str | None = None
    internal_ip: str | None = None
    autostop: AutostopSection | None = None
    p2p_port: Port = 8770
    path: str = "~/shoal"
    venv_activate: str | None = None
    memory_gb: float | None = Field(None, ge=0)
    cpus: int | None = Field(None, ge=1)
    gpu: str | None = None
    gpu_count: int = Field(0, ge=0)
    gpu_vram_gb: float = Field(0.0, ge=0)
    role: Role = Role.AUTO
    status: HostStatus = HostStatus.READY
    labels: dict[str, str] = Field(default_factory=dict)
    storage_paths: dict[Category, str] = Field(default_factory=dict)
    cloudflare_tunnel: str | None = None
    tunnel_token_id: SecretStr | None = None
    tunnel_token_secret: SecretStr | None = None

    @model_validator(mode="after")
    def _reachable(self) -> HostEntry:
        if not self.ssh_host and not self.tailscale_ip:
            raise ValueError("needs ssh_host or tailscale_ip (the address peers reach it at)")
        return self

    @property
    def address(self) -> str:
        """Where peers reach this host: `tailscale_ip` when set, else `ssh_host`."""
        address = self.tailscale_ip or self.ssh_host
        assert address is not None
        return address


class SyncSection(_Frozen):
    """`sync:` defaults for data sync."""

    batch_size: int = Field(100, ge=1)
    timeout: float = Field(300.0, gt=0)
    retry_count: int = Field(3, ge=0)


class BreakerSection(_Frozen):
    """`circuit_breaker:` defaults for every peer's breaker."""

    failure_threshold: int = Field(5, ge=1)
    recovery_timeout: float = Field(60.0, gt=0)


class StackEntry(_Frozen):
    """One of `stacks:`: a named cluster size a run asks for with `--stack NAME`."""

    nodes: int = Field(1, ge=1, le=1024)
    role: str = Field("any", min_length=1)


class Inventory(_Frozen):
    """A whole inventory file. `source` is where it was read from (None when built in code)."""

    cluster: ClusterSection = Field(default_factory=ClusterSection)
    hosts: dict[NodeId, HostEntry] = Field(default_factory=dict)
    sync: SyncSection = Field(default_factory=SyncSection)
    circuit_breaker: BreakerSection = Field(default_factory=BreakerSection)
    stacks: dict[str, StackEntry] = Field(default_factory=dict)
    source: Path | None = Field(None, exclude=True)

    @property
    def voters(self) -> tuple[str, ...]:
        """The fixed voter set: `cluster.voters`, or every host when that list is absent."""
        if self.cluster.voters is not None:
            return self.cluster.voters
        return tuple(sorted(self.hosts))


def _consistency_problems(
    host_names: list[str],
    endpoints: Mapping[str, tuple[str, int]],
    voters: tuple[str, ...] | None,
    doc: YamlDocument | None,
) -> list[str]:
    """Problems across fields: voters that are not hosts, two hosts on one address:port."""

    def where(*loc: str) -> str:
        return f"{doc.where(loc)}: " if doc is not None else ""

    problems = []
    if not host_names:
        problems.append(f"{where('hosts')}hosts: the inventory lists no hosts")
    for index, voter in enumerate(voters or ()):
        if voter not in host_names:
            known = ", ".join(sorted(host_names)) or "none"
            problems.append(
                f"{where('cluster', 'voters', str(index))}cluster.voters[{index}]: "
                f"'{voter}' is not a host in hosts (hosts: {known})"
            )
    if voters is not None and len(set(voters)) != len(voters):
        problems.append(f"{where('cluster', 'voters')}cluster.voters: lists a voter twice")
    if voters is not None and not voters:
        problems.append(f"{where('cluster', 'voters')}cluster.voters: must not be empty")
    seen: dict[tuple[str, int], str] = {}
    for name, endpoint in endpoints.items():
        if endpoint in seen:
            problems.append(
                f"{where('hosts', name)}hosts.{name}: address {endpoint[0]}:{endpoint[1]} "
                f"is also used by hosts.{seen[endpoint]}"
            )
        else:
            seen[endpoint] = name
    return problems


def _partial_consistency_problems(data: Mapping[str, Any], doc: YamlDocument | None) -> list[str]:
    """The cross-field problems of data that failed schema validation, from what did validate.

    So one pass of `shoal hosts check` reports a duplicate address beside a bad port.
    """
    hosts = data.get("hosts")
    if not isinstance(hosts, Mapping):
        return []
    endpoints = {}
    for name, entry in hosts.items():
        try:
            host = HostEntry.model_validate(entry)
        except ValidationError:
            continue
        endpoints[str(name)] = (host.address, host.p2p_port)
    cluster = data.get("cluster")
    raw_voters = cluster.get("voters") if isinstance(cluster, Mapping) else None
    voters = None
    if isinstance(raw_voters, list) and all(isinstance(v, str) for v in raw_voters):
        voters = tuple(raw_voters)
    return _consistency_problems([str(name) for name in hosts], endpoints, voters, doc)


def parse_inventory(data: Mapping[str, Any], doc: YamlDocument | None = None) -> Inventory:
    """Validate inventory data; every problem is reported at once in one InventoryError."""
    try:
        inventory = Inventory.model_validate(dict(data))
    except ValidationError as exc:
        problems = validation_problems(Inventory, exc, doc)
        extra = [p for p in _partial_consistency_problems(data, doc) if p not in problems]
        raise InventoryError([*problems, *extra]) from exc
    endpoints = {name: (host.address, host.p2p_port) for name, host in inventory.hosts.items()}
    problems = _consistency_problems(
        list(inventory.hosts), endpoints, inventory.cluster.voters, doc
    )
    if problems:
        raise InventoryError(problems)
    if doc is not None:
        inventory = inventory.model_copy(update={"source": doc.path})
    return inventory


def load_inventory(path: Path | str) -> Inventory:
    """Read and validate the inventory at `path`; errors name the file, line and field."""
    path = Path(path).expanduser()
    try:
        doc = load_yaml_mapping(path, "inventory")
    except ConfigError as exc:
        raise InventoryError(exc.problems) from exc
    return parse_inventory(doc.data, doc)


def eligible_hosts(
    inventory: Inventory,
    role: Role | str | None = None,
    min_gpu_vram_gb: float = 0.0,
    labels: Mapping[str, str] | None = None,
) -> dict[str, HostEntry]:
    """Ready hosts that can take `role` (its own role or auto), with enough VRAM and the labels."""
    wanted = Role(role) if role is not None else None
    chosen = {}
    for name, host in sorted(inventory.hosts.items()):
        if host.status is not HostStatus.READY:
            continue
        if wanted is not None and host.role not in (wanted, Role.AUTO):
            continue
        if host.gpu_vram_gb < min_gpu_vram_gb:
            continue
        if labels and any(host.labels.get(k) != v for k, v in labels.items()):
            continue
        chosen[name] = host
    return chosen
