"""The membership half of bench/scale_sim.py: N daemons' real `Membership` (SWIM with Lifeguard,
node/membership) on one `VirtualLoop` over a `SimNetwork`, with the daemon's default timeouts
and meta, and the scenarios: SIGKILLs, datagram loss, a 10% partition and its heal.

Every member runs the daemon's code unchanged; only the network and the clock are simulated.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bench.scale_net import CLUSTER, SimNetwork, VirtualLoop
from config import PROTOCOL_META, PROTOCOL_VERSION, RELEASE_META
from config.timeouts import Timeouts
from node.election.claims import gpu_uuids_meta
from node.election.roles import NPROC_META
from node.membership.rules import suspicion_bounds_s, sync_interval_s
from node.membership.service import Membership, MetaValue
from node.membership.types import EventKind, Member, MemberEvent, MemberState, SwimTuning
from node.membership.wire import encode_update, member_record, state_chunks

PORT = 8770
GPUS_PER_NODE = 8


def node_id(index: int) -> str:
    return f"node-{index:05d}"


def address_of(index: int) -> str:
    return f"10.{index // 62500}.{index // 250 % 250}.{index % 250 + 1}"


def gpu_uuids(index: int) -> list[str]:
    return [f"GPU-{index:08x}-{gpu:04x}-4b5c-8d9e-{index * 8 + gpu:012x}" for gpu in range(8)]


def node_meta(index: int) -> dict[str, MetaValue]:
    """What a daemon with 8 H100s advertises (node/daemon.py `_start_membership`, node/boot.py
    `gpu_meta`), on a TLS cluster (auth mode and certificate serial included)."""
    return {
        RELEASE_META: "0.1.0",
        PROTOCOL_META: PROTOCOL_VERSION,
        "role": "auto",
        "cluster": CLUSTER,
        "config_hash": "3f9a1c27be0d4e21",
        NPROC_META: GPUS_PER_NODE,
        "gpu_count": GPUS_PER_NODE,
        "gpu": "NVIDIA H100 80GB HBM3",
        "gpu_vram_gb": 79.6,
        **gpu_uuids_meta(gpu_uuids(index)),
        "auth": "mtls",
        "cert_serial": f"{index * 7919 + 0x5A17:032x}",
    }


@dataclass
class Observations:
    """What the listeners of every member saw: deaths of the watched victims (observer -> time),
    deaths of live members, first suspicions, and during a partition, per observer, the live
    members it does not see alive."""

    victims: dict[str, dict[str, float]] = field(default_factory=dict)
    live: set[str] = field(default_factory=set)
    false_deaths: dict[tuple[str, int], float] = field(default_factory=dict)
    first_suspect: dict[tuple[str, int], float] = field(default_factory=dict)
    suspecting: set[tuple[str, str]] = field(default_factory=set)
    unseen: dict[str, set[str]] | None = None

    def on_event(self, observer: str, event: MemberEvent, now: float) -> None:
        kind, target = event.kind, event.member.node_id
        if kind is EventKind.DEAD:
            watched = self.victims.get(target)
            if watched is not None:
                watched.setdefault(observer, now)
            elif target in self.live:
                self.false_deaths.setdefault((target, event.member.incarnation), now)
        elif kind is EventKind.SUSPECT:
            self.first_suspect.setdefault((target, event.member.incarnation), now)
        if event.member.state is MemberState.SUSPECT:
            self.suspecting.add((observer, target))
        else:
            self.suspecting.discard((observer, target))
        unseen = self.unseen
        if unseen is not None and target in self.live:
            if event.member.state is MemberState.ALIVE:
                unseen[observer].discard(target)
            elif kind in (EventKind.SUSPECT, EventKind.DEAD):
                unseen[observer].add(target)


class SimCluster:
    """`size` members, each knowing all others alive (a warm start), started on `loop`."""

    def __init__(self, loop: VirtualLoop, size: int, seed: int, *, seal: bool = False) -> None:
        self.loop = loop
        self.size = size
        self.rng = random.Random(seed)
        self.network = SimNetwork(loop, random.Random(seed * 7 + 1), seal=seal)
        self.timeouts = Timeouts()
        self.tuning = SwimTuning()
        self.seen = Observations()
        self.nodes: dict[str, Membership] = {}
        self.killed: set[str] = set()

    async def start(self) -> None:
        loop, now = self.loop, self.loop.time()
        metas = [node_meta(i) for i in range(self.size)]
        known = [
            Member(node_id(i), address_of(i), PORT, MemberState.ALIVE, 0, metas[i], now)
            for i in range(self.size)
        ]
        for index in range(self.size):
            member = Membership(
                node_id(index),
                address_of(index),
                PORT,
                metas[index],
                self.network.endpoint(address_of(index), PORT),
                self.timeouts,
                cluster=CLUSTER,
                rng=random.Random(self.rng.getrandbits(64)),
                clock=loop.time,
                tuning=self.tuning,
            )
            member.preload(known)
            member.add_listener(self._listener(member.self_id))
            self.nodes[member.self_id] = member
        self.seen.live = set(self.nodes)
        for member in self.nodes.values():
            await member.start()

    def _listener(self, observer: str) -> Callable[[MemberEvent], None]:
        seen, clock = self.seen, self.loop.time

        def on_event(event: MemberEvent) -> None:
            seen.on_event(observer, event, clock())

        return on_event

    def suspicion_max_s(self) -> float:
        _, high = suspicion_bounds_s(
            self.timeouts.suspicion_s, self.size, self.tuning.suspicion_max_mult
        )
        return high

    def live_ids(self) -> list[str]:
        return [n for n in self.nodes if n not in self.killed]

    async def kill(self, victim: str) -> None:
        """SIGKILL: the host stops answering at once and its timers stop."""
        self.killed.add(victim)
        self.seen.live.discard(victim)
        self.seen.victims[victim] = {}
        self.network.crashed.add(address_of(int(victim.split("-")[1])))
        await self.nodes[victim].close()

    async def run_for(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def close(self) -> None:
        for member in self.nodes.values():
            await member.close()


@dataclass(frozen=True, slots=True)
class MembershipFigures:
    death_known_s: tuple[float, ...]
    false_deaths: dict[str, int]
    bytes_per_s_per_node: float
    partition_converge_s: float | None


async def kills(cluster: SimCluster, count: int, gap_s: float, limit_s: float) -> list[float]:
    """Kill `count` random members `gap_s` apart; per victim, seconds until every live member
    marked it dead (`limit_s` + inf when some never did)."""
    loop = cluster.loop
    victims = cluster.rng.sample(cluster.live_ids(), count)
    killed_at: dict[str, float] = {}
    for victim in victims:
        killed_at[victim] = loop.time()
        await cluster.kill(victim)
        await cluster.run_for(gap_s)
    deadline = loop.time() + limit_s

    def done() -> bool:
        live = len(cluster.live_ids())
        return all(len(cluster.seen.victims[v]) >= live for v in victims)

    while not done() and loop.time() < deadline:
        await cluster.run_for(0.1)
    live = set(cluster.live_ids())
    out = []
    for victim in victims:
        seen = cluster.seen.victims[victim]
        if live <= seen.keys():
            out.append(max(seen[n] for n in live) - killed_at[victim])
        else:
            out.append(math.inf)
    return out


async def lossy_windows(
    cluster: SimCluster, levels: Iterable[float], window_s: float
) -> dict[float, int]:
    """Drop each level's share of every datagram for `window_s`, one level after the other,
    then run loss-free until no member suspects a live one (each suspicion refuted or ended in
    a death; at most the longest suspicion); per level, the live members declared dead for
    suspicions that began in its window."""
    loop, seen = cluster.loop, cluster.seen
    windows: dict[float, tuple[float, float]] = {}
    for level in levels:
        start = loop.time()
        cluster.network.loss = level
        await cluster.run_for(window_s)
        windows[level] = (start, loop.time())
    cluster.network.loss = 0.0
    deadline = loop.time() + cluster.suspicion_max_s() + 1.0
    while loop.time() < deadline and any(t in seen.live for _, t in seen.suspecting):
        await cluster.run_for(0.25)
    return {
        level: sum(
            1 for key in seen.false_deaths if start <= seen.first_suspect.get(key, start) < end
        )
        for level, (start, end) in windows.items()
    }


async def partition_heal(cluster: SimCluster, fraction: float, limit_s: float) -> float | None:
    """Cut `fraction` of the live members off until suspicions of the far side ran out, heal,
    and return the seconds until every live member sees every other alive (None: not in
    `limit_s`)."""
    loop, seen = cluster.loop, cluster.seen
    live = cluster.live_ids()
    cut = set(cluster.rng.sample(live, max(1, round(len(live) * fraction))))
    seen.unseen = {n: set() for n in live}
    cluster.network.sides = {address_of(int(n.split("-")[1])): 1 for n in cut}
    await cluster.run_for(cluster.suspicion_max_s() + 2.0)
    cluster.network.sides = {}
    healed_at = loop.time()
    unseen = seen.unseen
    while any(unseen.values()):
        if loop.time() - healed_at > limit_s:
            seen.unseen = None
            return None
        await cluster.run_for(0.5)
    seen.unseen = None
    return loop.time() - healed_at


def percentile(values: Iterable[float], fraction: float) -> float:
    """The `fraction` quantile of `values`, interpolated between neighbours (inf stays inf)."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    if (math.isinf(ordered[high]) and position > low) or math.isinf(ordered[low]):
        return math.inf
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def push_pull(size: int, timeouts: Timeouts, tuning: SwimTuning) -> tuple[int, float]:
    """(bytes one member sends when a push-pull finds views differ: its whole view as `state`
    datagrams, sealed; seconds between its push-pulls) at `size` members, from the wire code."""
    records = [
        encode_update(
            member_record(
                Member(node_id(i), address_of(i), PORT, MemberState.ALIVE, 0, node_meta(i))
            )
        )
        for i in range(size)
    ]
    envelope = SimNetwork(VirtualLoop(), random.Random(0)).envelope
    chunks = state_chunks(node_id(0), 1, True, records, envelope.body_budget)
    overhead = len(envelope.seal(b"", 0.0, boot=1, seq=1))
    interval = sync_interval_s(timeouts.probe_interval_s, tuning.sync_every_probes, size)
    return sum(len(chunk) + overhead for chunk in chunks), interval
