"""The `static` provider: the inventory's ready hosts. Acquiring picks a free matching host;
start and stop are no-ops (shoal does not power hosts it did not create) and say so."""

from __future__ import annotations

from config import HostEntry, HostStatus, Inventory
from net import peer_url
from node.errors import ProviderError
from node.providers.base import RELEASED, RUNNING, ActionResult, GPUQuery, NodeHandle

NO_OP = "static provider: inventory hosts are not started or stopped by shoal (no-op)"


def host_matches(entry: HostEntry, query: GPUQuery) -> bool:
    """Whether an inventory host satisfies `query`: GPU type (case-insensitive substring of its
    `gpu`), at least `count` GPUs, and `min_vram_gb` per GPU when given."""
    if entry.status is not HostStatus.READY:
        return False
    if query.count > 0:
        if not entry.gpu or query.type.lower() not in entry.gpu.lower():
            return False
        if entry.gpu_count < query.count:
            return False
    return not (query.min_vram_gb is not None and entry.gpu_vram_gb < query.min_vram_gb)


class StaticProvider:
    """Hands out the inventory's hosts, each to one holder at a time (in this process)."""

    name = "static"

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._held: set[str] = set()

    def _handle(self, host: str, state: str = RUNNING) -> NodeHandle:
        entry = self.inventory.hosts[host]
        labels = dict(entry.labels)
        if entry.gpu:
            labels |= {"gpu": entry.gpu, "gpu_count": str(entry.gpu_count)}
        return NodeHandle(
            provider=self.name,
            id=host,
            ssh=host,
            state=state,
            labels=labels,
            url=peer_url(entry.address, entry.p2p_port),
        )

    async def acquire(self, query: GPUQuery) -> NodeHandle:
        for host, entry in sorted(self.inventory.hosts.items()):
            if host not in self._held and host_matches(entry, query):
                self._held.add(host)
                return self._handle(host)
        wanted = f"{query.count} x {query.type}" if query.count else "any host"
        raise ProviderError(
            f"static provider: no free ready host of the inventory has {wanted}"
            + (f" with {query.min_vram_gb} GB" if query.min_vram_gb is not None else "")
            + f" (held: {', '.join(sorted(self._held)) or 'none'}); add one or release one"
        )

    async def release(self, handle: NodeHandle) -> None:
        self._check(handle)
        self._held.discard(handle.id)

    async def start(self, handle: NodeHandle) -> ActionResult:
        self._check(handle)
        return ActionResult(handle, False, NO_OP)

    async def stop(self, handle: NodeHandle) -> ActionResult:
        self._check(handle)
        return ActionResult(handle, False, NO_OP)

    async def list(self) -> list[NodeHandle]:
        return [
            self._handle(host, RUNNING if host in self._held else RELEASED)
            for host in sorted(self.inventory.hosts)
        ]

    def _check(self, handle: NodeHandle) -> None:
        if handle.provider != self.name or handle.id not in self.inventory.hosts:
            raise ProviderError(f"static provider: {handle.provider}/{handle.id} is not its host")
