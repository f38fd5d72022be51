"""`acquire_node`: the seed's tri-modal pattern (an SSH target, a known node, or a new one
from a provider) in one function."""

from __future__ import annotations

from config import Inventory
from node.errors import ProviderError
from node.providers.base import GPUQuery, NodeHandle, Provider


async def acquire_node(
    ssh: str | None = None,
    node_id: str | None = None,
    provision: GPUQuery | None = None,
    *,
    provider: Provider | None = None,
    inventory: Inventory | None = None,
) -> tuple[str | None, NodeHandle | None]:
    """(SSH target, handle) for exactly one of: `ssh` (`[user@]host[:port]` or an inventory
    host name; no handle), `node_id` (a host of `inventory`; no handle) or `provision` (a node
    acquired from `provider`; its handle, which the caller releases). The SSH target is None
    for a provided node without SSH (the `local` provider's); use `handle.url` then."""
    given = [
        name
        for name, value in (("ssh", ssh), ("node_id", node_id), ("provision", provision))
        if value
    ]
    if len(given) != 1:
        raise ValueError(f"acquire_node takes exactly one of ssh, node_id, provision; got {given}")
    if ssh:
        return ssh, None
    if node_id:
        if inventory is None or node_id not in inventory.hosts:
            known = ", ".join(sorted(inventory.hosts)) if inventory else "no inventory given"
            raise ProviderError(f"node_id {node_id!r} is not a host of the inventory ({known})")
        return node_id, None
    if provider is None:
        raise ProviderError("provision needs a provider (static, local, or your own)")
    assert provision is not None
    handle = await provider.acquire(provision)
    return handle.ssh, handle
