"""The YAML host inventory: schema, loading with clear errors, and host selection."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


class HostEntry(_Frozen):
    """One host of the inventory; its key in `hosts:` is its node id."""

    ssh_host: str | None = None
    tailscale_ip: str | None = None
    ssh_user: str | None = None
    ssh_port: Port = 22
    ssh_key: str | None = None
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


class Inventory(_Frozen):
    """A whole inventory file. `source` is where it was read from (None when built in code)."""

    cluster: ClusterSection = Field(default_factory=ClusterSection)
    hosts: dict[NodeId, HostEntry] = Field(default_factory=dict)
    sync: SyncSection = Field(default_factory=SyncSection)
    circuit_breaker: BreakerSection = Field(default_factory=BreakerSection)
    source: Path | None = Field(None, exclude=True)

    @property
    def voters(self) -> tuple[str, ...]:
        """The fixed voter set: `cluster.voters`, or every host when that list is absent."""
        if self.cluster.voters is not None:
            return self.cluster.voters
        return tuple(sorted(self.hosts))


def _consistency_problems(inventory: Inventory, doc: YamlDocument | None) -> list[str]:
    def where(*loc: str) -> str:
        return f"{doc.where(loc)}: " if doc is not None else ""

    problems = []
    if not inventory.hosts:
        problems.append(f"{where('hosts')}hosts: the inventory lists no hosts")
    for index, voter in enumerate(inventory.cluster.voters or ()):
        if voter not in inventory.hosts:
            known = ", ".join(sorted(inventory.hosts)) or "none"
            problems.append(
                f"{where('cluster', 'voters', str(index))}cluster.voters[{index}]: "
                f"'{voter}' is not a host in hosts (hosts: {known})"
            )
    voters = inventory.cluster.voters or ()
    if len(set(voters)) != len(voters):
        problems.append(f"{where('cluster', 'voters')}cluster.voters: lists a voter twice")
    if inventory.cluster.voters is not None and not voters:
        problems.append(f"{where('cluster', 'voters')}cluster.voters: must not be empty")
    seen: dict[tuple[str, int], str] = {}
    for name, host in inventory.hosts.items():
        endpoint = (host.address, host.p2p_port)
        if endpoint in seen:
            problems.append(
                f"{where('hosts', name)}hosts.{name}: address {host.address}:{host.p2p_port} "
                f"is also used by hosts.{seen[endpoint]}"
            )
        else:
            seen[endpoint] = name
    return problems


def parse_inventory(data: Mapping[str, Any], doc: YamlDocument | None = None) -> Inventory:
    """Validate inventory data; every problem is reported at once in one InventoryError."""
    try:
        inventory = Inventory.model_validate(dict(data))
    except ValidationError as exc:
        raise InventoryError(validation_problems(Inventory, exc, doc)) from exc
    problems = _consistency_problems(inventory, doc)
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
