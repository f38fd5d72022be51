"""mDNS discovery with python-zeroconf: advertise this node as `_shoal._tcp.local.` and browse.

Every query is a QM (multicast-answer) question and no unicast target is ever given, so all
traffic is multicast on the chosen interfaces; this also keeps several nodes sharing port 5353
on one host (dev mode, SO_REUSEPORT) from stealing each other's unicast answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from zeroconf import DNSQuestionType, ServiceStateChange, Zeroconf
from zeroconf import Error as ZeroconfError
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from config.quietlog import QuietLog
from node.addresses import IPNetwork, preferred_address
from node.discovery.candidates import Advert, Candidate
from node.errors import DiscoveryError

SERVICE_TYPE = "_shoal._tcp.local."
log = logging.getLogger(__name__)


def advert_properties(advert: Advert) -> dict[str, str]:
    """The TXT properties of an advert: id, cluster, version and API port, nothing else."""
    return {
        "id": advert.node_id,
        "cluster": advert.cluster,
        "version": advert.version,
        "port": str(advert.port),
    }


def service_info(
    advert: Advert, name: str | None = None, server: str | None = None
) -> AsyncServiceInfo:
    """The zeroconf record set of an advert.

    `name` defaults to `<node id>._shoal._tcp.local.`, the host name `server` to `name`.
    """
    name = name or f"{advert.node_id}.{SERVICE_TYPE}"
    return AsyncServiceInfo(
        SERVICE_TYPE,
        name,
        port=advert.port,
        properties=advert_properties(advert),
        server=server or name,
        parsed_addresses=list(advert.addresses),
    )


def advert_from_txt(
    properties: Mapping[str, str | None], addresses: Sequence[str], srv_port: int | None
) -> Advert | None:
    """The advert a peer published, or None when it is not a well-formed shoal advert. An
    advert without a cluster id gets cluster "" (unknown: a release before cluster ids)."""
    node_id = properties.get("id")
    cluster = properties.get("cluster") or ""
    port_text = properties.get("port") or ""
    port = int(port_text) if port_text.isdigit() else srv_port
    if not node_id or port is None or not 1 <= port <= 65535:
        return None
    return Advert(node_id, cluster, properties.get("version") or "", port, tuple(addresses))


def candidate_for(
    peer: Advert, own: Advert, networks: Sequence[IPNetwork] = ()
) -> Candidate | None:
    """The candidate a peer's advert gives, or None: other cluster, our own advert, no address.
    An advert naming no cluster ("") is taken as ours: membership checks its datagrams."""
    if (peer.cluster and peer.cluster != own.cluster) or peer.node_id == own.node_id:
        return None
    address = preferred_address(peer.addresses, networks)
    return None if address is None else Candidate(address, peer.port, "mdns", peer.node_id)


class MdnsAgent:
    """Owns one AsyncZeroconf: our registration, the browser, and the resolutions in flight."""

    def __init__(
        self,
        advert: Advert,
        on_candidate: Callable[[Candidate], None],
        *,
        interfaces: Sequence[str],
        networks: Sequence[IPNetwork],
        timeout_s: float,
    ) -> None:
        self._advert = advert
        self._on_candidate = on_candidate
        self._interfaces = list(interfaces)
        self._networks = tuple(networks)
        self._timeout_s = timeout_s
        self._aiozc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._resolving: dict[str, asyncio.Task[None]] = {}
        self._peers: dict[str, Candidate] = {}
        self._quiet = QuietLog(log)
        self._closed = False

    @property
    def peers(self) -> dict[str, Candidate]:
        """Peers of our cluster whose advert is current, by node id."""
        return {c.node_id: c for c in self._peers.values() if c.node_id is not None}

    async def start(self) -> None:
        """Open the sockets, register our advert (probing its name) and start browsing.

        Raises DiscoveryError, with nothing left open, when zeroconf cannot start.
        """
        try:
            self._aiozc = AsyncZeroconf(interfaces=self._interfaces)
            info = service_info(self._advert)
            async with asyncio.timeout(self._timeout_s):
                announced = await self._aiozc.async_register_service(info, allow_name_change=True)
            self._info = info
            self._browser = AsyncServiceBrowser(
                self._aiozc.zeroconf,
                [SERVICE_TYPE],
                handlers=[self._on_state_change],
                question_type=DNSQuestionType.QM,
            )
            await self._await_broadcast(announced)
        except (OSError, RuntimeError, ValueError, TimeoutError, ZeroconfError) as exc:
            await self.close()
            reason = str(exc) or type(exc).__name__
            where = ", ".join(self._interfaces)
            raise DiscoveryError(f"mDNS could not start on {where}: {reason}") from exc
        if info.name != f"{self._advert.node_id}.{SERVICE_TYPE}":
            log.warning(
                "%s: another host on the LAN advertises our mDNS name; advertising as %s",
                self._advert.node_id,
                info.name,
            )
        log.info(
            "%s: mDNS advertising %s on %s",
            self._advert.node_id,
            info.name,
            ", ".join(self._interfaces),
        )

    async def update(self, advert: Advert) -> None:
        """Publish a changed advert (same node id) under the registered name."""
        if self._aiozc is None or self._info is None or self._closed:
            raise DiscoveryError("mDNS is not running")
        info = service_info(advert, self._info.name, self._info.server)
        try:
            announced = await self._aiozc.async_update_service(info)
            self._info, self._advert = info, advert
            await self._await_broadcast(announced)
        except (OSError, RuntimeError, ZeroconfError, TimeoutError) as exc:
            raise DiscoveryError(f"mDNS update of {info.name} failed: {exc}") from exc

    async def close(self) -> None:
        """Send goodbyes for our advert, stop browsing, close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._resolving.values())
        self._resolving.clear()
        for task in tasks:
            task.cancel()
        aiozc, self._aiozc = self._aiozc, None
        browser, self._browser = self._browser, None
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            if aiozc is not None and self._info is not None:
                await self._await_broadcast(await aiozc.async_unregister_service(self._info))
        except (OSError, RuntimeError, ZeroconfError, TimeoutError) as exc:
            log.warning("%s: mDNS goodbye failed: %s", self._advert.node_id, exc)
        finally:
            if browser is not None:
                await browser.async_cancel()
            if aiozc is not None:
                await aiozc.async_close()

    async def _await_broadcast(self, announced: Awaitable[object]) -> None:
        async with asyncio.timeout(self._timeout_s):
            await announced

    def _on_state_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        if self._closed or (self._info is not None and name == self._info.name):
            return
        if state_change is ServiceStateChange.Removed:
            self._cancel_resolve(name)
            gone = self._peers.pop(name, None)
            if gone is not None:
                log.info(
                    "%s: mDNS advert of %s withdrawn (goodbye or expiry); membership decides "
                    "whether it is alive",
                    self._advert.node_id,
                    gone.node_id,
                )
            return
        self._cancel_resolve(name)
        task = asyncio.get_running_loop().create_task(self._resolve(name))
        self._resolving[name] = task
        task.add_done_callback(lambda done: self._forget_resolve(name, done))

    def _cancel_resolve(self, name: str) -> None:
        task = self._resolving.pop(name, None)
        if task is not None:
            task.cancel()

    def _forget_resolve(self, name: str, task: asyncio.Task[None]) -> None:
        if self._resolving.get(name) is task:
            del self._resolving[name]

    async def _resolve(self, name: str) -> None:
        aiozc = self._aiozc
        if aiozc is None:
            return
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        try:
            found = await info.async_request(
                aiozc.zeroconf, self._timeout_s * 1000, question_type=DNSQuestionType.QM
            )
        except (OSError, RuntimeError, ZeroconfError) as exc:
            self._quiet.failed(name, "%s: resolving %s: %s", self._advert.node_id, name, exc)
            return
        if not found:
            self._quiet.failed(
                name,
                "%s: mDNS peer %s did not answer within %g s",
                self._advert.node_id,
                name,
                self._timeout_s,
            )
            return
        self._quiet.clear(name)
        self._handle_advert(name, info)

    def _handle_advert(self, name: str, info: AsyncServiceInfo) -> None:
        peer = advert_from_txt(info.decoded_properties, info.parsed_addresses(), info.port)
        if peer is None:
            log.debug("%s: %s is not a shoal advert, ignored", self._advert.node_id, name)
            return
        candidate = candidate_for(peer, self._advert, self._networks)
        if not peer.cluster:
            log.debug(
                "%s: mDNS advert %s names no cluster id; taken as ours", self._advert.node_id, name
            )
        if candidate is None:
            if peer.node_id == self._advert.node_id and peer.cluster == self._advert.cluster:
                self._quiet.failed(
                    f"dup:{name}",
                    "%s: %s advertises our node id from %s; node ids must be unique",
                    self._advert.node_id,
                    name,
                    ", ".join(peer.addresses),
                )
            else:
                log.debug(
                    "%s: ignoring mDNS advert %s (cluster %r, node %s; this node is of cluster %r)",
                    self._advert.node_id,
                    name,
                    peer.cluster,
                    peer.node_id,
                    self._advert.cluster,
                )
            return
        self._peers[name] = candidate
        self._on_candidate(candidate)
