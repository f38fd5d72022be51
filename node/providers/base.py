"""The node provider interface: acquire, start, stop, release and list nodes of one source
(the inventory, this machine, a cloud). A provider is any class with these methods; shoal
ships `static` and `local`, a cloud provider is written the same way (docs/providers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

RUNNING = "running"
STOPPED = "stopped"
RELEASED = "released"


@dataclass(frozen=True)
class GPUQuery:
    """What to acquire: GPU type and count, price and VRAM bounds, CUDA, disks (seed's fields;
    a provider uses the ones it can honour and says which it ignores)."""

    type: str = "A100"
    count: int = 1
    max_price: float | None = None
    min_vram_gb: int | None = None
    min_cuda: str = "12.0"
    cloud_type: str = "secure"
    container_disk_gb: int = 100
    volume_disk_gb: int = 0


@dataclass(frozen=True)
class NodeHandle:
    """One node of a provider: its id there, how to reach it (`ssh`: an inventory host name or
    `[user@]host[:port]`; `url`: its daemon's API when known), its state and labels."""

    provider: str
    id: str
    ssh: str | None
    state: str = RUNNING
    labels: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None

    def with_state(self, state: str) -> NodeHandle:
        """This handle in another state."""
        return replace(self, state=state)


@dataclass(frozen=True)
class ActionResult:
    """What start or stop did: the handle after it, whether anything changed, and why not."""

    handle: NodeHandle
    changed: bool
    message: str = ""


@runtime_checkable
class Provider(Protocol):
    """A source of nodes. Every method raises ProviderError (node.errors) when it cannot act."""

    name: str

    async def acquire(self, query: GPUQuery) -> NodeHandle:
        """A node that satisfies `query`, running; ProviderError when none can be had."""
        ...

    async def release(self, handle: NodeHandle) -> None:
        """Give the node back (a cloud provider terminates it); the handle is dead after."""
        ...

    async def start(self, handle: NodeHandle) -> ActionResult:
        """Start a stopped node."""
        ...

    async def stop(self, handle: NodeHandle) -> ActionResult:
        """Stop a node, keeping it acquired (its disk stays)."""
        ...

    async def list(self) -> list[NodeHandle]:
        """Every node this provider has acquired or knows."""
        ...
