"""Partitions, one-way cuts and local health over InMemoryNetwork: each side decides about the
other at its own pace, and heals back to one view."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from node.membership.timers import ProbeWait
from node.membership.types import EventKind, MemberState
from tests.node.membership_sim import FAST, Cluster, host, running_cluster, wait_for


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with running_cluster() as built:
        yield built


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
    # relays are beyond the cut), 2 at the majority. A probe whose nacks all came late (a loop
    # stalled on a loaded host) has none to go by and waits for k = 3, as the rule says; never
    # for any other count.
    at_minority = set().union(*(expected[name] for name in minority))
    at_majority = set().union(*(expected[name] for name in majority))
    assert 1 in at_minority, expected
    assert at_minority <= {1, 3}, expected
    assert 2 in at_majority, expected
    assert at_majority <= {2, 3}, expected


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
