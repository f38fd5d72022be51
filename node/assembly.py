"""A node's parts, built before any opens: what the settings resolve to (`resolve_node`), then
every long-lived part with the handles it needs, in the one list the daemon opens in order and
closes in reverse (`build_node`):

    WAL -> health -> the served components (node.parts) -> the HTTP API -> membership ->
    election -> discovery -> background sync -> auto-stop -> the CRL spread's loops

The API's sockets are bound before this (node.startup.listen_sockets), so every part, and the
runtime, is built knowing the port."""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from config import (
    PROTOCOL_META,
    PROTOCOL_VERSION,
    RELEASE_META,
    Inventory,
    NodeSettings,
    load_inventory,
    shoal_version,
)
from config.tls import TlsContexts, serial_text
from health import BreakerRegistry, DiskWrites, NodeMetrics
from node.boot import (
    HostHealth,
    Secrets,
    advertise_address,
    breaker_config,
    host_health,
    inventory_cluster_name,
    load_secrets,
    resolve_node_id,
)
from node.component import Component
from node.discovery.start import DiscoveryPart
from node.election.service import ElectionService, VoterSet, resolve_voters
from node.errors import KeyringError, StartupError
from node.identity import AUTH_META, CERT_META, open_tls
from node.lifecycle import ApiServer, CrlLoops, ElectionPart, MembershipPart, SyncLoop, WalPart
from node.membership.keyring import GossipKeys
from node.membership.service import Membership, MetaValue, UdpMembershipTransport
from node.metrics import ServedMetrics, served_metrics
from node.parts import PartsInputs, ServedParts, served_parts
from node.providers import StaticProvider
from node.routes import build_app
from node.runs.nodes import NodeStarter, ProviderNodes, StaticNodes
from node.runtime import NodeRuntime
from node.security import AuthPolicy
from node.signers import node_bound
from node.startup import prepare_data_dir
from wal import WalConfig, WriteAheadLog

MAX_REQUEST_LINE_BYTES = 256 * 1024
"""GET /v1/records/{store}/get takes up to 1000 keys in its query string."""
DISCOVERY_REFEED_S = 3.0
"""How often inventory hosts and seeds are offered to membership again (a seed that started
after us is found within this time; each offer costs at most a few datagrams per host)."""


@dataclass(frozen=True)
class Resolved:
    """What a node's settings resolve to before anything opens: its secrets, inventory,
    identity, TLS, breakers, metrics, voters and the nodes a run may start."""

    settings: NodeSettings
    secrets: Secrets
    inventory: Inventory | None
    node_id: str
    gossip_keys: GossipKeys | None
    tls: TlsContexts | None
    breakers: BreakerRegistry
    metrics: NodeMetrics
    voters: VoterSet
    run_nodes: NodeStarter

    @property
    def known_nodes(self) -> frozenset[str]:
        """This node, the voters and the inventory's hosts."""
        hosts = () if self.inventory is None else self.inventory.hosts
        return frozenset({self.node_id, *self.voters.voters, *hosts})


def resolve_node(settings: NodeSettings) -> Resolved:
    """Resolve `settings` (StartupError or ConfigError naming what is wrong); prepares the data
    dir and opens the gossip keyring, nothing else."""
    secrets = load_secrets(settings)
    inventory = load_inventory(settings.inventory) if settings.inventory else None
    settings = inventory_cluster_name(settings, inventory)
    prepare_data_dir(settings.data_dir)
    try:
        gossip_keys = GossipKeys.open(
            settings.data_dir, secret=secrets.cluster, cluster=settings.cluster_name
        )
    except KeyringError as exc:
        raise StartupError(f"gossip keyring: {exc}") from exc
    node_id = resolve_node_id(settings, inventory)
    breakers = BreakerRegistry(breaker_config(settings, inventory))
    metrics = NodeMetrics(node_id, shoal_version())
    metrics.bind_breakers(breakers)
    return Resolved(
        settings=settings,
        secrets=secrets,
        inventory=inventory,
        node_id=node_id,
        gossip_keys=gossip_keys,
        tls=open_tls(settings, node_id),
        breakers=breakers,
        metrics=metrics,
        voters=resolve_voters(settings, inventory, node_id),
        run_nodes=StaticNodes() if inventory is None else ProviderNodes(StaticProvider(inventory)),
    )


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """What the daemon itself does for its parts: leave the cluster, stop, judge a sender."""

    leave: Callable[[], Awaitable[None]]
    request_stop: Callable[[str], None]
    known_node: Callable[[str], bool]
    protocol_log: logging.Logger | Any
    rng: random.Random


@dataclass(frozen=True)
class NodeParts:
    """A node's parts, built, not opened: `components` is the one list, in order."""

    runtime: NodeRuntime
    components: tuple[Component, ...]
    served: ServedParts
    election: ElectionService
    membership: Membership
    api: ApiServer
    sockets: list[socket.socket]
    host: HostHealth

    def release(self) -> None:
        """Close what the parts hold from the moment they are built (the API's sockets, the
        GPU reader), for a start that stopped before their part opened. Call it once every
        opened part is closed; closing twice is harmless."""
        for sock in self.sockets:
            sock.close()
        self.host.reader.close()


def build_node(resolved: Resolved, sockets: list[socket.socket], hooks: Hooks) -> NodeParts:
    """Every part of the node over the bound `sockets`, in the order they open."""
    settings = resolved.settings
    port = int(sockets[0].getsockname()[1])
    writes = DiskWrites()
    wal = WriteAheadLog(
        settings.wal_path,
        config=WalConfig.from_timeouts(settings.timeouts),
        observer=resolved.metrics,
    )
    host = host_health(settings, wal, resolved.metrics, writes)
    try:
        membership = _membership(resolved, port, host, hooks.rng)
    except BaseException:
        host.reader.close()
        raise
    runtime = NodeRuntime(
        settings=settings,
        node_id=resolved.node_id,
        address=advertise_address(settings),
        version=shoal_version(),
        breakers=resolved.breakers,
        port=port,
        wal=wal,
        health=host.checker,
        metrics=resolved.metrics,
        membership=membership,
        gpus=host.gpus,
        owned_gpus=host.owned,
        training_nproc=host.training_nproc,
        gpu_reader=host.reader,
        tls=resolved.tls,
    )
    series = served_metrics(runtime)
    election = ElectionService(runtime, resolved.voters)
    served = served_parts(_inputs(resolved, runtime, election, writes, series, hooks))
    api = _api(resolved, runtime, sockets, served, election, series, hooks)
    components: list[Component] = [WalPart(wal), host, *served.components, api]
    components += [
        MembershipPart(membership),
        ElectionPart(
            election, membership, resolved.inventory, resolved.secrets.cluster, wal, hooks.rng
        ),
        DiscoveryPart(
            runtime,
            port,
            lambda found: membership.add_candidate(found.address, found.port),
            resolved.inventory,
            DISCOVERY_REFEED_S,
        ),
        SyncLoop(served.sync, membership),
    ]
    if served.autostop is not None:
        components.append(served.autostop)
    if served.crl is not None:
        components.append(CrlLoops(served.crl))
    return NodeParts(runtime, tuple(components), served, election, membership, api, sockets, host)


def _inputs(
    resolved: Resolved,
    runtime: NodeRuntime,
    election: ElectionService,
    writes: DiskWrites,
    series: ServedMetrics | None,
    hooks: Hooks,
) -> PartsInputs:
    """What the served components are made of."""
    inventory = resolved.inventory
    return PartsInputs(
        runtime=runtime,
        secrets=resolved.secrets,
        election=election,
        inventory=inventory,
        voters=resolved.voters.voters,
        stacks={} if inventory is None else inventory.stacks,
        run_nodes=resolved.run_nodes,
        writes=writes,
        metrics=series,
        gossip_keys=resolved.gossip_keys,
        leave=hooks.leave,
        request_stop=hooks.request_stop,
    )


def _api(
    resolved: Resolved,
    runtime: NodeRuntime,
    sockets: list[socket.socket],
    served: ServedParts,
    election: ElectionService,
    series: ServedMetrics | None,
    hooks: Hooks,
) -> ApiServer:
    """The HTTP API of the served components on `sockets`, signed requests checked by the
    cluster's policy, fenced routes by the plan this node applies."""
    settings = resolved.settings

    def app() -> web.Application:
        return build_app(
            runtime,
            AuthPolicy(
                secret=resolved.secrets.cluster,
                metrics_token=resolved.secrets.metrics_token,
                skew_s=settings.timeouts.auth_skew_s,
                known_node=hooks.known_node,
                cluster=settings.cluster_name,
                **node_bound(runtime),
            ),
            served.components,
            gates=[served.dashboard.middleware],
            identity=served.identity,
            fence=election.plan_fence,
            http_metrics=None if series is None else series.http,
        )

    return ApiServer(
        runtime,
        sockets,
        app,
        served.identity,
        served.dashboard.close,  # open event streams end before the server stops
        protocol_log=hooks.protocol_log,
        max_line_size=MAX_REQUEST_LINE_BYTES,
    )


def _membership(resolved: Resolved, port: int, host: HostHealth, rng: random.Random) -> Membership:
    """Membership over UDP on the API's port number, not started; its meta names this node's
    release, role, cluster, configuration, GPUs and (with TLS) its certificate."""
    settings = resolved.settings
    meta: dict[str, MetaValue] = {
        RELEASE_META: shoal_version(),
        PROTOCOL_META: PROTOCOL_VERSION,
        "role": settings.role.value,
        "cluster": settings.cluster_name,
        "config_hash": settings.config_hash(),
        **host.gpu_meta,
    }
    if resolved.tls is not None:
        meta[AUTH_META] = settings.auth_mode.value
        meta[CERT_META] = serial_text(resolved.tls.material.own.serial)
    transport = UdpMembershipTransport(
        settings.bind,
        port,
        secret=resolved.secrets.cluster,
        cluster=settings.cluster_name,
        max_skew_s=settings.timeouts.auth_skew_s,
        keys=resolved.gossip_keys,
    )
    return Membership(
        resolved.node_id,
        advertise_address(settings),
        port,
        meta,
        transport,
        settings.timeouts,
        cluster=settings.cluster_name,
        rng=rng,
    )
