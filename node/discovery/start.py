"""Discovery as a node runs it: its advert, the interfaces mDNS uses, and mDNS switched off
(with a note) when it cannot start, so the inventory and seeds still work."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import ifaddr

from config import Inventory
from node.addresses import choose_interfaces
from node.component import Check, Endpoint, loop_check
from node.discovery.candidates import Advert, Candidate
from node.discovery.feed import Discovery
from node.errors import DiscoveryError
from node.runtime import NodeRuntime

log = logging.getLogger("node.daemon")


class DiscoveryPart:
    """Discovery as a component: mDNS (when on), the inventory and seeds feed `add_candidate`
    from `open()` to `close()`; when mDNS cannot start it is logged, noted on the node, and
    discovery runs without it. Its loop's health is the `discovery` check."""

    def __init__(
        self,
        runtime: NodeRuntime,
        port: int,
        add_candidate: Callable[[Candidate], None],
        inventory: Inventory | None,
        refeed_interval_s: float,
    ) -> None:
        self._runtime = runtime
        self._port = port
        self._add_candidate = add_candidate
        self._inventory = inventory
        self._refeed_interval_s = refeed_interval_s
        self.discovery: Discovery | None = None

    def _make(self, mdns: bool) -> Discovery:
        runtime = self._runtime
        settings = runtime.settings
        advert = Advert(
            node_id=runtime.node_id,
            cluster=settings.cluster_name,
            version=runtime.version,
            port=self._port,
            addresses=(runtime.address,),
        )
        return Discovery(
            advert,
            self._add_candidate,
            mdns=mdns,
            inventory=self._inventory,
            seeds=settings.seeds,
            timeouts=settings.timeouts,
            interfaces=choose_interfaces(ifaddr.get_adapters(), None, settings.bind),
            refeed_interval_s=self._refeed_interval_s,
        )

    async def open(self) -> None:
        try:
            self.discovery = await self._make(self._runtime.settings.mdns).__aenter__()
        except DiscoveryError as exc:
            log.error("mDNS discovery is off, inventory and seeds still work: %s", exc)
            self._runtime.notes.append(f"mDNS discovery is off: {exc}")
            self.discovery = await self._make(False).__aenter__()

    def routes(self) -> Sequence[Endpoint]:
        return ()

    def checks(self) -> Mapping[str, Check]:
        return loop_check(None if self.discovery is None else self.discovery.loop_health)

    async def close(self) -> None:
        if self.discovery is not None:
            await self.discovery.close()
