"""`ready_node`: from a DeploySpec's `ssh` or `provision` to the URL of a running, deployed
daemon (acquire, then `shoal deploy` over SSH, then its API URL). The jobs client's `ssh` and
`provision` modes call it, then start the job there, and release `handle` unless keep_alive."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from config import HostEntry, Inventory
from net import peer_url
from node.errors import DeployError, ProviderError
from node.providers.acquire import acquire_node
from node.providers.base import GPUQuery, NodeHandle, Provider
from node.ssh.deploy import DeployResult, deploy
from node.ssh.executor import DEFAULT_KNOWN_HOSTS, SSHExecutor, parse_ssh_spec
from node.ssh.plan import DEFAULT_CACHE_DIR, FAILED


@dataclass(frozen=True)
class ReadyNode:
    """A node whose daemon answers at `url`; `handle` when a provider acquired it (the caller
    releases it), `deployed` what deploy did (None for a provider node without SSH)."""

    url: str
    handle: NodeHandle | None
    deployed: DeployResult | None


def with_target(inventory: Inventory, target: str) -> tuple[Inventory, str]:
    """(inventory, host name) for an SSH target: an inventory host as is, else the inventory
    with `[user@]host[:port]` added under the name of its host."""
    if target in inventory.hosts:
        return inventory, target
    spec = parse_ssh_spec(target)
    name = spec.address
    if name in inventory.hosts:
        raise DeployError(f"{target}: its host {name} is an inventory host; name it as {name}")
    entry = HostEntry(ssh_host=spec.address, ssh_user=spec.user, ssh_port=spec.port)
    hosts = {**inventory.hosts, name: entry}
    return inventory.model_copy(update={"hosts": hosts, "source": None}), name


def inventory_text(inventory: Inventory) -> str:
    """The inventory to push: its file as written, else its YAML dump."""
    if inventory.source is not None:
        return inventory.source.read_text()
    return yaml.safe_dump(inventory.model_dump(mode="json", exclude_none=True))


async def ready_node(
    ssh: str | None = None,
    node_id: str | None = None,
    provision: GPUQuery | None = None,
    *,
    secret: bytes,
    inventory: Inventory | None = None,
    provider: Provider | None = None,
    known_hosts: Path | str = DEFAULT_KNOWN_HOSTS,
    python: str = "python3",
    offline: bool = False,
    cache_dir: Path = DEFAULT_CACHE_DIR,
) -> ReadyNode:
    """Acquire the node (acquire_node), deploy shoal to it over SSH, and return its URL. A node
    a provider acquired is released again when the deploy fails."""
    target, handle = await acquire_node(
        ssh, node_id, provision, provider=provider, inventory=inventory
    )
    if target is None:
        if handle is None or handle.url is None:
            raise ProviderError("the provider's node has neither an SSH target nor a URL")
        return ReadyNode(handle.url, handle, None)
    if not secret:
        raise ProviderError(
            f"deploying shoal to {target} over SSH needs the cluster secret (secret_file, "
            "chmod 600); the node would otherwise run without authentication"
        )
    try:
        full, name = with_target(inventory or Inventory(hosts={}), target)
        text = inventory_text(full)
        async with SSHExecutor(full, known_hosts) as executor:
            result = (
                await deploy(
                    executor,
                    [name],
                    secret=secret,
                    inventory_text=text,
                    python=python,
                    offline=offline,
                    cache_dir=cache_dir,
                )
            )[name]
        if result.status == FAILED:
            raise DeployError(f"deploy to {name} failed: {result.reason}")
    except BaseException:
        if handle is not None and provider is not None:
            await provider.release(handle)
        raise
    entry = full.hosts[name]
    return ReadyNode(peer_url(entry.address, entry.p2p_port), handle, result)
