"""Discovery: feeds candidate peers to membership from mDNS, the inventory and seeds.

Discovery only finds; it never declares a peer dead (that is membership's job).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence

import ifaddr

from config import Inventory, Timeouts
from config.closing import AsyncClosing
from config.quietlog import QuietLog
from health import LoopHealth
from node.addresses import local_addresses, local_networks, normalize_address
from node.discovery.candidates import (
    Advert,
    Candidate,
    inventory_candidates,
    parse_seed,
    resolve_host,
)
from node.discovery.mdns import MdnsAgent
from node.errors import DiscoveryError

log = logging.getLogger(__name__)


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


class Discovery(AsyncClosing):
    """Owns the zeroconf instance (when `mdns`) and the task that re-feeds inventory and seeds.

    `on_candidate` is called in the event loop for every candidate, repeatedly: mDNS peers of
    our cluster when their advert appears or changes, and every `refeed_interval_s` the current
    mDNS peers, the inventory hosts (except this node) and the resolved seeds. mDNS listens on
    `interfaces` (default: the advert's addresses). Entering raises DiscoveryError when mDNS
    cannot start; the caller may then run a Discovery with `mdns=False`. Bad seeds raise
    ConfigError at construction.
    """

    def __init__(
        self,
        advert: Advert,
        on_candidate: Callable[[Candidate], None],
        *,
        mdns: bool,
        inventory: Inventory | None,
        seeds: Sequence[str],
        timeouts: Timeouts,
        interfaces: Sequence[str] | None = None,
        refeed_interval_s: float = 10.0,
    ) -> None:
        if refeed_interval_s <= 0:
            raise ValueError(f"refeed_interval_s must be positive, got {refeed_interval_s}")
        self._advert = advert
        self._on_candidate = on_candidate
        self._mdns_enabled = mdns
        self._inventory = inventory
        self._seeds = tuple(parse_seed(seed) for seed in seeds)
        self._timeouts = timeouts
        self._interfaces = tuple(interfaces) if interfaces is not None else advert.addresses
        self._refeed_interval_s = refeed_interval_s
        self._mdns: MdnsAgent | None = None
        self._refeed_task: asyncio.Task[None] | None = None
        self._quiet = QuietLog(log)
        self._round_errors: list[str] = []
        self._state = _State.UNOPENED
        self.loop_health = LoopHealth("discovery")
        """Each re-feed round (failed: it raised, or a seed did not resolve), for the
        `discovery` health component."""

    @property
    def advert(self) -> Advert:
        """What this node currently advertises."""
        return self._advert

    @property
    def mdns_active(self) -> bool:
        """True while our mDNS advert is registered and the browser runs."""
        return self._mdns is not None

    def mdns_peers(self) -> dict[str, Candidate]:
        """Peers of our cluster whose mDNS advert is current, by node id."""
        return self._mdns.peers if self._mdns is not None else {}

    async def _enter(self) -> None:
        if self._state is not _State.UNOPENED:
            raise RuntimeError(f"Discovery is {self._state.value}; it cannot be opened again")
        self._state = _State.OPENED
        try:
            if self._mdns_enabled:
                await self._start_mdns()
        except BaseException:
            await self.close()
            raise
        self._refeed_task = asyncio.get_running_loop().create_task(
            self._refeed_forever(), name=f"discovery-refeed-{self._advert.node_id}"
        )

    async def close(self) -> None:
        """Say goodbye on mDNS first, then stop everything. Idempotent and irreversible."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        mdns, self._mdns = self._mdns, None
        task, self._refeed_task = self._refeed_task, None
        try:
            if mdns is not None:
                await mdns.close()
        finally:
            if task is not None:
                task.cancel()
                await asyncio.wait([task])

    async def update_advert(self, advert: Advert) -> None:
        """Advertise changed properties (cluster, version, port, addresses) of this node.

        Raises ValueError when the node id changes, DiscoveryError when mDNS fails (the new
        advert still applies to the inventory and seed sources).
        """
        if self._state is not _State.OPENED:
            raise DiscoveryError(f"Discovery is {self._state.value}")
        if advert.node_id != self._advert.node_id:
            raise ValueError(f"node id cannot change ({self._advert.node_id} -> {advert.node_id})")
        self._advert = advert
        if self._mdns is not None:
            await self._mdns.update(advert)

    async def feed_once(self) -> None:
        """Feed every current mDNS peer, every inventory host and every resolvable seed once."""
        for candidate in self.mdns_peers().values():
            self._emit(candidate)
        if self._inventory is not None:
            for candidate in inventory_candidates(self._inventory, self._advert):
                self._emit(candidate)
        async with asyncio.TaskGroup() as group:
            for host, port in self._seeds:
                group.create_task(self._feed_seed(host, port))

    async def _start_mdns(self) -> None:
        adapters = ifaddr.get_adapters()
        local = {normalize_address(address) for address in local_addresses(adapters)}
        usable = [i for i in self._interfaces if normalize_address(i) in local]
        foreign = [i for i in self._interfaces if normalize_address(i) not in local]
        if foreign:
            log.warning(
                "%s: mDNS interfaces %s are not addresses of this host; skipped",
                self._advert.node_id,
                ", ".join(foreign),
            )
        if not usable:
            raise DiscoveryError(
                "no usable mDNS interface (configured: "
                f"{', '.join(self._interfaces) or 'none'}); mDNS is off"
            )
        agent = MdnsAgent(
            self._advert,
            self._emit,
            interfaces=usable,
            networks=local_networks(adapters),
            timeout_s=self._timeouts.mdns_s,
        )
        await agent.start()
        self._mdns = agent

    async def _refeed_forever(self) -> None:
        while True:
            self._round_errors.clear()
            try:
                await self.feed_once()
                if self._round_errors:
                    self.loop_health.record_failure(self._round_errors[-1])
                else:
                    self.loop_health.record_success(f"{len(self.mdns_peers())} mDNS peers")
            except Exception as exc:  # a bug in one round must not end discovery
                self.loop_health.record_failure(exc)
                self._quiet.failed(
                    "refeed",
                    "%s: discovery round failed: %r",
                    self._advert.node_id,
                    exc,
                )
            await asyncio.sleep(self._refeed_interval_s)

    async def _feed_seed(self, host: str, port: int) -> None:
        key = f"seed:{host}:{port}"
        try:
            addresses = await resolve_host(host, port, self._timeouts.mdns_s)
        except DiscoveryError as exc:
            self._round_errors.append(f"{key}: {exc}")
            self._quiet.failed(key, "%s: %s: %s", self._advert.node_id, key, exc)
            return
        self._quiet.clear(key)
        own = {normalize_address(address) for address in self._advert.addresses}
        for address in addresses:
            if not (normalize_address(address) in own and port == self._advert.port):
                self._emit(Candidate(address, port, "seed"))

    def _emit(self, candidate: Candidate) -> None:
        try:
            self._on_candidate(candidate)
        except Exception:
            log.exception(
                "%s: candidate callback failed for %s:%s",
                self._advert.node_id,
                candidate.address,
                candidate.port,
            )
