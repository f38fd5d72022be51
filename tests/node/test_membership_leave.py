"""A member that leaves on purpose: every peer marks it `left` at once (never suspect), and it
no longer counts among the members a suspicion waits on for confirmations."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from node.membership.rules import suspicion_members
from node.membership.types import EventKind, MemberState
from tests.node.membership_sim import Cluster, host, running_cluster, wait_for


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with running_cluster() as built:
        yield built


def test_members_that_left_are_not_counted_for_suspicion() -> None:
    states = [MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT]
    assert suspicion_members(states) == 4
    assert suspicion_members([]) == 1


async def test_a_leave_is_seen_at_once_and_is_no_confirmer_of_a_later_suspicion(
    cluster: Cluster,
) -> None:
    await cluster.grow(4)
    await wait_for(cluster.all_alive, what="convergence")
    leaver = cluster.nodes.pop("n3")
    await leaver.leave(timeout_s=1.0)
    await wait_for(lambda: cluster.all_see("n3", MemberState.LEFT), what="n3 left everywhere")
    await leaver.close()
    for name in ("n0", "n1", "n2"):
        kinds = {e.kind for e in cluster.seen(name, "n3", set(EventKind))}
        assert kinds & {EventKind.SUSPECT, EventKind.DEAD} == set(), (name, kinds)
    # n0 alone, cut from n1 and n2: no relay of its probes can answer (no nack), so a
    # suspicion waits for every member that could confirm; n3 left and is not one of them
    cluster.network.partition([host(0)], [host(1), host(2)])
    expected: set[int] = set()

    def suspected() -> bool:
        for other in ("n1", "n2"):
            suspicion = cluster.nodes["n0"]._suspicions.get(other)  # test peeks at it
            if suspicion is not None and suspicion.origin == "n0":
                expected.add(suspicion.expected)
        return cluster.all_see("n1", MemberState.DEAD, ["n0"]) and cluster.all_see(
            "n2", MemberState.DEAD, ["n0"]
        )

    await wait_for(suspected, timeout_s=10.0, what="n0 to declare n1 and n2 dead")
    assert expected == {1}, expected
