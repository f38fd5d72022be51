"""Whole clusters of the real membership code over InMemoryNetwork, with shrunk timing."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable

import pytest

from config.timeouts import Timeouts
from node.membership.service import InMemoryNetwork, Membership
from node.membership.timers import ProbeWait
from node.membership.types import EventKind, MemberEvent, MemberState, Update
from node.membership.wire import Message, MessageKind, encode_message

FAST = Timeouts(
    probe_interval_s=0.05,
    probe_timeout_s=0.02,
    indirect_probe_timeout_s=0.04,
    suspicion_s=0.15,
    dead_reap_s=30.0,
)
PORT = 7000


def host(index: int) -> str:
    return f"10.0.0.{index + 1}"


class Cluster:
    """Members named n0, n1, ... at 10.0.0.1, 10.0.0.2, ...; every event recorded per member."""

    def __init__(self, network: InMemoryNetwork) -> None:
        self.network = network
        self.nodes: dict[str, Membership] = {}
        self.events: dict[str, list[MemberEvent]] = {}

    async def add(
        self,
        index: int,
        *,
        seed: int | None = 0,
        timeouts: Timeouts = FAST,
        node_id: str | None = None,
        address: str | None = None,
    ) -> Membership:
        name = node_id or f"n{index}"
        address = address or host(index)
        endpoint = self.network.endpoint(address, PORT, cluster="lab")
        member = Membership(
            name,
            address,
            PORT,
            {"role": "training", "index": index},
            endpoint,
            timeouts,
            cluster="lab",
            rng=random.Random(index),
        )
        key = name if name not in self.nodes else f"{name}@{address}"
        self.events[key] = []
        member.add_listener(self.events[key].append)
        await member.start()
        self.nodes[key] = member
        if seed is not None and seed != index:
            member.add_candidate(host(seed), PORT)
        return member

    async def grow(self, count: int, **kwargs: object) -> list[Membership]:
        return [await self.add(index, **kwargs) for index in range(count)]  # type: ignore[arg-type]

    async def crash(self, name: str) -> None:
        member = self.nodes.pop(name)
        self.network.isolate(member.member(member.self_id).address)  # type: ignore[union-attr]
        await member.close()

    def state(self, observer: str, node_id: str) -> MemberState | None:
        view = self.nodes[observer].member(node_id)
        return None if view is None else view.state

    def all_see(self, node_id: str, state: MemberState, observers: Iterable[str] = ()) -> bool:
        names = list(observers) or [name for name in self.nodes if name != node_id]
        return all(self.state(name, node_id) == state for name in names)

    def all_alive(self) -> bool:
        size = len(self.nodes)
        return all(node.counts()["alive"] == size for node in self.nodes.values())

    def seen(self, observer: str, node_id: str, kinds: set[EventKind]) -> list[MemberEvent]:
        return [e for e in self.events[observer] if e.member.node_id == node_id and e.kind in kinds]

    async def close(self) -> None:
        for member in self.nodes.values():
            await member.close()


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or condition}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    network = InMemoryNetwork(random.Random(7), delay_s=0.0005, jitter_s=0.0005)
    built = Cluster(network)
    try:
        yield built
    finally:
        await built.close()
        network.close()


FAILED = {EventKind.SUSPECT, EventKind.DEAD}


async def test_join_through_one_seed_teaches_everyone_everyone(cluster: Cluster) -> None:
    await cluster.grow(6)
    await wait_for(cluster.all_alive, what="all six to know all six")
    view = cluster.nodes["n5"].members()
    assert view[0].is_self
    assert view[0].node_id == "n5"
    assert view[0].state == MemberState.ALIVE
    assert [m.node_id for m in view[1:]] == ["n0", "n1", "n2", "n3", "n4"]
    n3 = cluster.nodes["n1"].member("n3")
    assert n3 is not None
    assert dict(n3.meta) == {"role": "training", "index": 3}
    assert n3.address == host(3)
    assert cluster.nodes["n4"].counts() == {"alive": 6, "suspect": 0, "dead": 0, "left": 0}


async def test_crashed_member_goes_suspect_then_dead_at_every_peer(cluster: Cluster) -> None:
    await cluster.grow(5)
    await wait_for(cluster.all_alive, what="convergence")
    await cluster.crash("n4")
    await wait_for(lambda: cluster.all_see("n4", MemberState.DEAD), what="n4 dead everywhere")
    suspected_first = [
        name
        for name in cluster.nodes
        if [e.kind for e in cluster.seen(name, "n4", FAILED)][:2]
        == [EventKind.SUSPECT, EventKind.DEAD]
    ]
    assert suspected_first, "at least the detecting members suspect before declaring dead"
    for name in cluster.nodes:
        assert cluster.seen(name, "n4", {EventKind.DEAD})


async def test_suspected_live_member_refutes(cluster: Cluster) -> None:
    await cluster.grow(4)
    await wait_for(cluster.all_alive, what="convergence")
    target = cluster.nodes["n3"]
    assert target.incarnation == 0
    rumour = Message(
        MessageKind.GOSSIP, "n0", 0, updates=(Update("n3", MemberState.SUSPECT, 0, by="n0"),)
    )
    liar = cluster.network.endpoint("10.0.0.99", PORT, cluster="lab")
    await liar.start(lambda body, source: None)
    for index in range(3):
        liar.send(encode_message(rumour), (host(index), PORT))
    await wait_for(lambda: target.incarnation >= 1, what="n3 to refute")
    await wait_for(
        lambda: all(
            (view := node.member("n3")) is not None
            and view.state == MemberState.ALIVE
            and view.incarnation >= 1
            for node in cluster.nodes.values()
        ),
        what="the refutation to spread",
    )
    await liar.close()
    for name in cluster.nodes:
        assert not cluster.seen(name, "n3", {EventKind.DEAD})
    assert cluster.seen("n0", "n3", {EventKind.SUSPECT})


async def test_leave_is_seen_at_once_everywhere(cluster: Cluster) -> None:
    await cluster.grow(5)
    await wait_for(cluster.all_alive, what="convergence")
    leaver = cluster.nodes.pop("n2")
    await leaver.leave(timeout_s=0.5)
    assert leaver.member("n2").state == MemberState.LEFT  # type: ignore[union-attr]
    await leaver.close()
    await asyncio.sleep(0.005)  # a few deliveries, far below a probe round
    assert cluster.all_see("n2", MemberState.LEFT)
    for name in cluster.nodes:
        assert not cluster.seen(name, "n2", FAILED)
    await leaver.close()


async def test_partition_then_heal_brings_everyone_back(cluster: Cluster) -> None:
    await cluster.grow(5)
    await wait_for(cluster.all_alive, what="convergence")
    left_side, right_side = [host(0), host(1)], [host(2), host(3), host(4)]
    cluster.network.partition(left_side, right_side)
    await wait_for(
        lambda: (
            cluster.all_see("n0", MemberState.DEAD, ["n2", "n3", "n4"])
            and cluster.all_see("n4", MemberState.DEAD, ["n0", "n1"])
        ),
        what="each side to declare the other dead",
    )
    cluster.network.heal()
    await wait_for(cluster.all_alive, timeout_s=8.0, what="all alive after healing")


async def test_a_partition_neither_slows_a_side_down_nor_waits_on_the_far_side(
    cluster: Cluster,
) -> None:
    # Relays across the cut cannot nack; relays on our side can. Those silent ones must not raise
    # our local health score (Lifeguard would: the minority then probed ~9x slower and took ~10 s
    # to declare the far side dead), and a suspicion we start does not wait for their
    # confirmation. The nack arrives 0.05 s before the indirect timeout, no less than the stall
    # threshold, so only a stall that is discounted anyway could make it late.
    roomy = FAST.model_copy(update={"indirect_probe_timeout_s": 0.25})
    await cluster.grow(5, timeouts=roomy)
    await wait_for(cluster.all_alive, what="convergence")
    minority, majority = ["n0", "n1"], ["n2", "n3", "n4"]
    cluster.network.partition([host(0), host(1)], [host(2), host(3), host(4)])
    health: dict[str, int] = dict.fromkeys(cluster.nodes, 0)
    expected: dict[str, set[int]] = {name: set() for name in cluster.nodes}

    def split() -> bool:
        for name, node in cluster.nodes.items():
            health[name] = max(health[name], node.local_health)
            far = majority if name in minority else minority
            for other in far:
                suspicion = node._suspicions.get(other)  # test peeks at the running suspicion
                if suspicion is not None and suspicion.origin == name:
                    expected[name].add(suspicion.expected)
        return all(cluster.all_see(m, MemberState.DEAD, minority) for m in majority) and all(
            cluster.all_see(m, MemberState.DEAD, majority) for m in minority
        )

    await wait_for(split, timeout_s=10.0, what="each side to declare the other dead")
    assert health == dict.fromkeys(cluster.nodes, 0), health
    # A suspicion we start waits only for the relays that nacked: 1 at the minority (the other
    # relays are beyond the cut), 2 at the majority.
    assert set().union(*(expected[name] for name in minority)) == {1}, expected
    assert set().union(*(expected[name] for name in majority)) == {2}, expected


async def test_relays_of_a_failed_probe_are_members_that_can_still_answer(
    cluster: Cluster,
) -> None:
    # A 3|5 split: picked at random, 3 relays of a minority node's probe are all beyond the cut
    # one time in five, so none can nack and its local health jumps. Relays are the members
    # heard from most recently instead, and the other two of the minority keep talking to it.
    # Timing at half the defaults; the nack lands 0.08 s before the indirect timeout, past the
    # 0.075 s stall threshold, so only a discounted stall could make it late.
    half = FAST.model_copy(
        update={
            "probe_interval_s": 0.25,
            "probe_timeout_s": 0.15,
            "indirect_probe_timeout_s": 0.4,
            "suspicion_s": 0.5,
        }
    )
    await cluster.grow(8, timeouts=half)
    await wait_for(cluster.all_alive, what="convergence")
    minority, majority = ["n0", "n1", "n2"], [f"n{i}" for i in range(3, 8)]
    cluster.network.partition([host(i) for i in range(3)], [host(i) for i in range(3, 8)])
    relays: dict[tuple[str, int], frozenset[str]] = {}
    health = dict.fromkeys(minority, 0)

    def split() -> bool:
        for name in minority:
            node = cluster.nodes[name]
            health[name] = max(health[name], node.local_health)
            for seq, wait in node._acks._waits.items():  # test peeks at probes in flight
                if isinstance(wait, ProbeWait) and wait.relays:
                    relays.setdefault((name, seq), wait.relays)
        return all(cluster.all_see(m, MemberState.DEAD, minority) for m in majority)

    await wait_for(split, timeout_s=20.0, what="the minority to declare the majority dead")
    assert relays, "no indirect probe seen"
    beyond = [sorted(chosen) for chosen in relays.values() if not chosen & set(minority)]
    assert not beyond, f"relays all beyond the cut: {beyond}"
    assert health == dict.fromkeys(minority, 0), health


def in_indirect_probe(node: Membership, target: str) -> bool:
    waits = node._acks._waits.values()  # test peeks at the probe in flight to time the stall
    return any(isinstance(w, ProbeWait) and w.target == target and w.relays for w in waits)


async def test_stall_of_our_own_loop_kills_no_one() -> None:
    # n0 -> n1 is cut, so n0 reaches n1 only through relays (4 hops of 15 ms). The loop freezes
    # for 1 s while that indirect probe is in flight: afterwards the probe's timeout fires before
    # the relayed ack can arrive. Only discounting timeouts that overlap a stall keeps n1 alive.
    network = InMemoryNetwork(random.Random(3), delay_s=0.015)
    slow = Cluster(network)
    try:
        roomy = FAST.model_copy(update={"indirect_probe_timeout_s": 0.08})
        await slow.grow(4, timeouts=roomy)
        await wait_for(slow.all_alive, what="convergence")
        network.cut(host(0), host(1))
        marks = {name: len(events) for name, events in slow.events.items()}
        n0 = slow.nodes["n0"]
        deadline = time.monotonic() + 5
        while not in_indirect_probe(n0, "n1"):
            assert time.monotonic() < deadline, "n0 never probed n1 through relays"
            await asyncio.sleep(0.001)
        time.sleep(1.0)  # the event loop (every member's) blocks for one second
        await asyncio.sleep(0.4)  # several probe rounds after the stall
        for name, events in slow.events.items():
            failures = [e for e in events[marks[name] :] if e.kind in FAILED]
            assert not failures, f"{name} declared {failures} after a stall of its own loop"
        assert n0.stall_count >= 1
        assert slow.all_alive()
    finally:
        await slow.close()
        network.close()


async def test_local_health_slows_a_member_that_misses_acks(cluster: Cluster) -> None:
    await cluster.grow(5)
    await wait_for(cluster.all_alive, what="convergence")
    sick = cluster.nodes["n0"]
    assert sick.local_health == 0
    for index in range(1, 5):
        cluster.network.cut(host(0), host(index))  # n0's datagrams are lost: it misses every ack
    await wait_for(lambda: sick.local_health >= 3, what="n0's local health score to rise")
    cluster.network.heal()
    await wait_for(lambda: sick.local_health == 0, timeout_s=8.0, what="n0 to heal")
    await wait_for(cluster.all_alive, timeout_s=8.0, what="all alive again")


async def test_one_way_cut_is_bridged_by_indirect_probes(cluster: Cluster) -> None:
    roomy = FAST.model_copy(update={"probe_timeout_s": 0.03, "indirect_probe_timeout_s": 0.1})
    await cluster.grow(5, timeouts=roomy)
    await wait_for(cluster.all_alive, what="convergence")
    cluster.network.cut(host(1), host(2))  # n1 -> n2 lost, n2 -> n1 delivered
    await asyncio.sleep(1.0)  # n1 and n2 probe each other about five times
    for name in cluster.nodes:
        assert not cluster.seen(name, "n2", {EventKind.DEAD})
        assert not cluster.seen(name, "n1", {EventKind.DEAD})
    assert cluster.state("n1", "n2") == MemberState.ALIVE
    assert cluster.state("n2", "n1") == MemberState.ALIVE


async def test_duplicate_node_id_is_reported_on_both_sides(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="node.membership.service")
    await cluster.grow(3)
    await wait_for(cluster.all_alive, what="convergence")
    original = cluster.nodes["n1"]
    twin = await cluster.add(9, node_id="n1", seed=0)
    conflicts = {
        key: cluster.seen(key, "n1", {EventKind.CONFLICT}) for key in ("n1", "n1@10.0.0.10")
    }
    await wait_for(
        lambda: all(cluster.seen(key, "n1", {EventKind.CONFLICT}) for key in conflicts),
        what="both claimants to report the conflict",
    )
    assert cluster.seen("n1", "n1", {EventKind.CONFLICT})[0].conflict_with == (host(9), PORT)
    assert cluster.seen("n1@10.0.0.10", "n1", {EventKind.CONFLICT})[0].conflict_with == (
        host(1),
        PORT,
    )
    assert original.members()[0].conflict == (host(9), PORT)
    assert twin.members()[0].conflict == (host(1), PORT)
    errors = [r for r in caplog.records if "claimed by two live nodes" in r.getMessage()]
    assert {r.getMessage().split(":")[0] for r in errors} >= {"n1"}
    assert len(errors) >= 2


async def test_dead_members_are_reaped(cluster: Cluster) -> None:
    quick_reap = FAST.model_copy(update={"dead_reap_s": 0.3})
    await cluster.grow(4, timeouts=quick_reap)
    await wait_for(cluster.all_alive, what="convergence")
    await cluster.crash("n3")
    await wait_for(lambda: cluster.all_see("n3", MemberState.DEAD), what="n3 dead")
    await wait_for(lambda: cluster.all_see("n3", None), what="n3 reaped")  # type: ignore[arg-type]
    assert cluster.seen("n0", "n3", {EventKind.REAPED})
    assert cluster.nodes["n0"].counts() == {"alive": 3, "suspect": 0, "dead": 0, "left": 0}


async def test_meta_update_spreads_with_a_new_incarnation(cluster: Cluster) -> None:
    await cluster.grow(4)
    await wait_for(cluster.all_alive, what="convergence")
    cluster.nodes["n2"].update_meta({"role": "inference", "gpu_count": 8})
    await wait_for(
        lambda: all(
            (view := node.member("n2")) is not None and view.meta.get("role") == "inference"
            for node in cluster.nodes.values()
        ),
        what="the new meta everywhere",
    )
    view = cluster.nodes["n0"].member("n2")
    assert view is not None
    assert view.incarnation == 1
    assert view.meta["gpu_count"] == 8
    assert cluster.seen("n0", "n2", {EventKind.UPDATED})


async def test_lifecycle_and_candidates(cluster: Cluster) -> None:
    member = await cluster.add(0, seed=None)
    member.add_candidate("10.0.0.200", PORT)  # nobody there: a few pings, then forgotten
    member.add_candidate(host(0), PORT)  # ourselves: ignored
    with pytest.raises(Exception, match="not an IP address"):
        member.add_candidate("some-host.example", PORT)
    await asyncio.sleep(0.3)
    assert member.counts()["alive"] == 1
    await member.close()
    await member.close()
    with pytest.raises(Exception, match="starts once"):
        await member.start()


async def test_lossy_network_kills_no_one() -> None:
    network = InMemoryNetwork(random.Random(11), delay_s=0.001, jitter_s=0.002, drop_rate=0.1)
    lossy = Cluster(network)
    try:
        await lossy.grow(5)
        await wait_for(lossy.all_alive, what="convergence despite 10% loss")
        await asyncio.sleep(1.0)
        for name in lossy.nodes:
            assert not [e for e in lossy.events[name] if e.kind == EventKind.DEAD]
        per_host = [network.bytes_sent(host(index)) for index in range(5)]
        assert all(sent > 0 for sent in per_host)
        assert sum(per_host) == network.total_bytes_sent()
    finally:
        await lossy.close()
        network.close()
