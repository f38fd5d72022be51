"""Discovery as a node starts it: its advert, the interfaces mDNS uses, and mDNS switched off
(with a note) when it cannot start, so the inventory and seeds still work."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AsyncExitStack

import ifaddr

from config import Inventory
from node.addresses import choose_interfaces
from node.discovery.candidates import Advert, Candidate
from node.discovery.feed import Discovery
from node.errors import DiscoveryError
from node.runtime import NodeRuntime

log = logging.getLogger("node.daemon")


async def open_discovery(
    stack: AsyncExitStack,
    runtime: NodeRuntime,
    port: int,
    add_candidate: Callable[[Candidate], None],
    inventory: Inventory | None,
    refeed_interval_s: float,
) -> Discovery:
    """Enter discovery on `stack`: mDNS (when on), the inventory and seeds feed `add_candidate`;
    when mDNS cannot start it is logged, noted on the node, and discovery runs without it."""
    settings = runtime.settings
    advert = Advert(
        node_id=runtime.node_id,
        cluster=settings.cluster_name,
        version=runtime.version,
        port=port,
        addresses=(runtime.address,),
    )
    interfaces = choose_interfaces(ifaddr.get_adapters(), None, settings.bind)

    def make_discovery(mdns: bool) -> Discovery:
        return Discovery(
            advert,
            add_candidate,
            mdns=mdns,
            inventory=inventory,
            seeds=settings.seeds,
            timeouts=settings.timeouts,
            interfaces=interfaces,
            refeed_interval_s=refeed_interval_s,
        )

    try:
        return await stack.enter_async_context(make_discovery(settings.mdns))
    except DiscoveryError as exc:
        log.error("mDNS discovery is off, inventory and seeds still work: %s", exc)
        runtime.notes.append(f"mDNS discovery is off: {exc}")
        return await stack.enter_async_context(make_discovery(False))
