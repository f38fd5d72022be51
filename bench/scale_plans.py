"""The planning half of bench/scale_sim.py: the coordinator at scale with the real planning and
election code (node.election.roles.compute_plan, node.plan.RolePlan, node.election.core).

`plan_compute` times compute_plan for N members of 8 GPUs each (capabilities read from the meta
they gossip) as the coordinator runs it after a death. `plan_travel` follows a new plan from its
publication to the last node that applies it, over a simulated network: the coordinator's real
heartbeat rounds (`core.publish_plan`, `core.on_tick`, `core.handle_heartbeat_ack`) decide who
gets the plan whole and who fetches it from whom (node.election.spread); every follower runs the
real `core.handle_heartbeat` / `core.adopt_fetched_plan`. Each node has one CPU (the daemon's
event loop) and one uplink; CPU costs are measured here once (encoding and parsing this very
plan) or assumed (the constants below); bytes are the JSON bodies as net/ sends them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from typing import Any

from aiohttp import ClientSession, web

from bench.scale_members import address_of, node_id, node_meta
from node.election import core
from node.election.messages import Heartbeat, HeartbeatAck, Outbound, PlanAnnounce
from node.election.roles import NodeCapabilities, RolePolicy, capabilities_from_meta, compute_plan
from node.election.state import DurableRecord, ElectionConfig, ElectionRole, initial_state
from node.plan import RolePlan

VOTERS = 5
LINK_BYTES_PER_S = 10e9 / 8
"""Each node's uplink: 10 Gbit/s."""
LATENCY_S = 0.00025
"""One way, within a data centre."""
PERSIST_S = 0.01
"""Writing an adopted plan to the WAL's state table (synchronous=FULL)."""
HEADER_BYTES = 400
"""HTTP request or answer headers (signature, fence, version)."""


def capabilities(size: int) -> list[NodeCapabilities]:
    """N members as the coordinator reads them from their gossiped meta."""
    return [capabilities_from_meta(node_id(i), address_of(i), node_meta(i)) for i in range(size)]


def plan_compute(size: int, runs: int = 3) -> tuple[RolePlan, RolePlan, float]:
    """(previous plan, the plan after one member died, the fastest of `runs` wall times of
    computing the latter)."""
    members = capabilities(size)
    policy = RolePolicy(min_training=1, max_training=size)
    first = compute_plan(1, 1, members, policy)
    survivors = members[:-1]
    best = float("inf")
    plan = first
    for _ in range(runs):
        started = time.perf_counter()
        plan = compute_plan(1, 2, survivors, policy, previous=first, highest_generation=1)
        best = min(best, time.perf_counter() - started)
    return first, plan, best


def wire_bytes(message: Any) -> int:
    return len(json.dumps(message.to_dict()).encode())


def _timed(work: Callable[[], object], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.process_time()  # CPU time: other helpers' load does not count
        work()
        best = min(best, time.process_time() - started)
    return best


@dataclass(frozen=True, slots=True)
class Costs:
    """CPU seconds of the plan's messages, measured on this machine."""

    encode_whole_s: float
    encode_hint_s: float
    parse_whole_s: float
    encode_document_s: float
    request_s: float
    """One end of one HTTP exchange: the server's all at once; a client's half when it sends
    the request and half when it reads the answer."""

    @classmethod
    def measure(cls, plan: RolePlan, hint: Heartbeat) -> Costs:
        whole = Heartbeat(plan.term, "c", 1, plan.fence, plan)
        body = json.dumps(whole.to_dict())
        document = PlanAnnounce("n", plan.term, "c", True, plan)
        return cls(
            _timed(lambda: json.dumps(whole.to_dict())),
            _timed(lambda: json.dumps(hint.to_dict()), 20),
            _timed(lambda: Heartbeat.from_dict(json.loads(body))),
            _timed(lambda: json.dumps(document.to_dict())),
            asyncio.run(request_cpu_s(hint)),
        )


async def request_cpu_s(hint: Heartbeat, count: int = 400) -> float:
    """CPU seconds of one end of one heartbeat exchange: half of what an aiohttp client and
    server in this process spend per request over loopback (no TLS, no signature: a floor)."""

    async def answer(request: web.Request) -> web.Response:
        await request.json()
        return web.json_response(HeartbeatAck(3, "n", 1, True).to_dict())

    app = web.Application()
    app.router.add_post("/hb", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    body = hint.to_dict()
    try:
        async with ClientSession() as session:

            async def one() -> None:
                async with session.post(f"http://127.0.0.1:{port}/hb", json=body) as reply:
                    await reply.read()

            await asyncio.gather(*(one() for _ in range(20)))
            started = time.process_time()
            for _ in range(count // 50):
                await asyncio.gather(*(one() for _ in range(50)))
            return (time.process_time() - started) / count / 2
    finally:
        await runner.cleanup()


@dataclass
class Host:
    """One node: its election state, when its CPU and uplink are free, who waits on it."""

    name: str
    state: Any
    cpu_free_at: float = 0.0
    link_free_at: float = 0.0
    applied_at: float | None = None
    pulling: bool = False
    waiters: list[tuple[Host, Heartbeat]] = field(default_factory=list)


@dataclass
class PlanTravel:
    """One new plan travelling from the coordinator `hosts[coordinator]` to every follower."""

    plan: RolePlan
    hosts: dict[str, Host]
    coordinator: str
    costs: Costs
    plan_bytes: int
    rng: random.Random = field(default_factory=lambda: random.Random(3))
    now: float = 0.0
    egress_bytes: int = 0
    ack_cpu_s: float = 0.0
    stepped_down_at: float | None = None
    unapplied: int = 0
    """Followers that have not applied the plan yet (counted, not looked for after each event:
    that look was O(N) per event, most of the plan phase's CPU at 10,000 nodes)."""
    _events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = field(
        default_factory=list
    )
    _seq: Any = field(default_factory=itertools.count)

    def at(self, when: float, action: Callable[..., None], *args: Any) -> None:
        heappush(self._events, (when, next(self._seq), action, args))

    def cpu(self, host: Host, cost_s: float) -> float:
        host.cpu_free_at = max(self.now, host.cpu_free_at) + cost_s
        return host.cpu_free_at

    def send(
        self, source: Host, size: int, ready: float, action: Callable[..., None], *a: Any
    ) -> None:
        size += HEADER_BYTES
        source.link_free_at = max(ready, source.link_free_at) + size / LINK_BYTES_PER_S
        if source.name == self.coordinator:
            self.egress_bytes += size
        self.at(source.link_free_at + LATENCY_S, action, *a)

    def round(self, outbound: list[Outbound]) -> None:
        coordinator = self.hosts[self.coordinator]
        for item in outbound:
            beat = item.message
            if not isinstance(beat, Heartbeat):
                continue  # it stepped down: a candidate's vote requests are not the plan's
            whole = beat.plan is not None
            cost = self.costs.encode_whole_s if whole else self.costs.encode_hint_s
            ready = self.cpu(coordinator, self.costs.request_s / 2 + cost)
            size = self.plan_bytes + 200 if whole else wire_bytes(beat)
            self.send(coordinator, size, ready, self.on_heartbeat, self.hosts[item.to], beat)

    def on_heartbeat(self, host: Host, beat: Heartbeat) -> None:
        cost = self.costs.request_s + (self.costs.parse_whole_s if beat.plan else 0.0)
        self.at(self.cpu(host, cost), self.handle_heartbeat, host, beat)

    def handle_heartbeat(self, host: Host, beat: Heartbeat) -> None:
        host.state, ack = core.handle_heartbeat(host.state, beat, self.now, self.rng)
        self.applied(host)
        if beat.plan is None and beat.plan_sources and host.applied_at is None and not host.pulling:
            host.pulling = True
            self.fetch(host, beat, 0)
        self.send(host, wire_bytes(ack), self.now, self.on_ack, ack)

    def on_ack(self, ack: HeartbeatAck) -> None:
        coordinator = self.hosts[self.coordinator]
        started = time.process_time()
        coordinator.state, _ = core.handle_heartbeat_ack(coordinator.state, ack, self.now, self.rng)
        spent = time.process_time() - started
        self.ack_cpu_s += spent
        self.cpu(coordinator, self.costs.request_s / 2 + spent)

    def applied(self, host: Host) -> None:
        if host.applied_at is not None or host.state.plan_fence != self.plan.fence:
            return
        host.applied_at = self.cpu(host, PERSIST_S)
        if host.name != self.coordinator:
            self.unapplied -= 1
        self.at(host.applied_at, self.serve_waiters, host)

    def serve_waiters(self, host: Host) -> None:
        waiting, host.waiters = host.waiters, []
        for puller, beat in waiting:
            self.serve(host, puller, beat)

    def fetch(self, puller: Host, beat: Heartbeat, index: int) -> None:
        if index >= len(beat.plan_sources):
            puller.pulling = False  # the next heartbeat, or the grace, brings it
            return
        source = self.hosts[beat.plan_sources[index]]
        self.send(
            puller,
            0,
            self.cpu(puller, self.costs.request_s / 2),
            self.on_fetch,
            source,
            puller,
            beat,
            index,
        )

    def on_fetch(self, source: Host, puller: Host, beat: Heartbeat, index: int) -> None:
        if source.applied_at is not None and source.applied_at <= self.now:
            self.serve(source, puller, beat)
            return
        source.waiters.append((puller, beat))
        self.at(self.now + 2.0, self.expire, source, puller, beat, index)

    def expire(self, source: Host, puller: Host, beat: Heartbeat, index: int) -> None:
        if (puller, beat) in source.waiters:
            source.waiters.remove((puller, beat))
            self.send(source, 100, self.now, self.fetch, puller, beat, index + 1)

    def serve(self, source: Host, puller: Host, beat: Heartbeat) -> None:
        ready = self.cpu(source, self.costs.request_s + self.costs.encode_document_s)
        self.send(source, self.plan_bytes + 150, ready, self.on_plan, puller, beat)

    def on_plan(self, puller: Host, beat: Heartbeat) -> None:
        cost = self.costs.request_s / 2 + self.costs.parse_whole_s
        self.at(self.cpu(puller, cost), self.adopt, puller, beat)

    def adopt(self, puller: Host, beat: Heartbeat) -> None:
        assert beat.plan_fence is not None
        assert beat.plan_digest is not None
        puller.state = core.adopt_fetched_plan(
            puller.state, self.plan, beat.plan_fence, beat.plan_digest
        )
        puller.pulling = False
        self.applied(puller)

    def run(self, until_s: float = 120.0) -> float | None:
        """Publish the plan; seconds until every follower applied it (None: not in until_s)."""
        coordinator = self.hosts[self.coordinator]
        coordinator.state, outbound = core.publish_plan(coordinator.state, self.plan, 0.0)
        coordinator.applied_at = 0.0
        self.round(outbound)
        interval = coordinator.state.config.heartbeat_interval_s
        self.at(interval, self.tick)
        followers = [h for h in self.hosts.values() if h.name != self.coordinator]
        self.unapplied = sum(1 for h in followers if h.applied_at is None)
        while self._events and self.now <= until_s:
            when, _, action, args = heappop(self._events)
            self.now = max(self.now, when)
            action(*args)
            if not self.unapplied:
                return max(h.applied_at or 0.0 for h in followers)
        return None

    def tick(self) -> None:
        coordinator = self.hosts[self.coordinator]
        coordinator.state, outbound = core.on_tick(coordinator.state, self.now, self.rng)
        if coordinator.state.role is not ElectionRole.COORDINATOR:
            self.stepped_down_at = self.now  # its lease ran out: voters' acks came too late
            return
        self.round(outbound)
        self.at(self.now + coordinator.state.config.heartbeat_interval_s, self.tick)


def plan_travel(previous: RolePlan, plan: RolePlan, *, pulls: bool = True) -> PlanTravel:
    """Every member of `plan` following coordinator node 0 and applying `previous`; with
    `pulls` False, none pulls (the previous release: the plan goes whole to each)."""
    nodes = sorted(plan.roles)
    voters = tuple(nodes[:VOTERS])
    rng = random.Random(5)
    hosts: dict[str, Host] = {}
    for name in nodes:
        config = ElectionConfig(name, voters, pulls_plans=pulls)
        state = initial_state(config, DurableRecord(term=plan.term), previous, -10.0, rng)
        hosts[name] = Host(name, replace(state, coordinator=voters[0], leader_seen_at=-0.1))
    coordinator = hosts[voters[0]]
    observers = frozenset(nodes[VOTERS:])
    coordinator.state = replace(
        coordinator.state,
        role=ElectionRole.COORDINATOR,
        coordinator=voters[0],
        won_at=-10.0,
        acked=dict.fromkeys(voters[1:], -0.1),
        observers=observers,
        peer_fences=dict.fromkeys(nodes[1:], previous.fence),
        whole_plans=frozenset() if pulls else observers,
        next_heartbeat_at=0.25,
        next_observer_heartbeat_at=1.0,
    )
    hint = Heartbeat(plan.term, voters[0], 1, plan.fence, None, plan.digest, tuple(voters))
    plan_bytes = len(json.dumps(plan.to_dict()).encode())
    return PlanTravel(plan, hosts, voters[0], Costs.measure(plan, hint), plan_bytes)
