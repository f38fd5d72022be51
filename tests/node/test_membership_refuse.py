"""Membership.refuse: a refused member (its certificate revoked) goes dead at the refusing node
and stays dead while it keeps refuting; its datagrams are dropped; advertising another mark
(a new certificate) or `allow` lets it back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from node.membership.types import MemberState, Update, freeze_meta
from node.membership.wire import Message, MessageKind, encode_message
from tests.node.membership_sim import PORT, Cluster, host, running_cluster, wait_for

MARK = ("cert_serial", "1A")


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with running_cluster() as built:
        yield built


def _refused_everywhere(cluster: Cluster, node_id: str) -> bool:
    return all(
        (view := node.member(node_id)) is not None
        and view.state == MemberState.DEAD
        and view.refused == "revoked"
        for name, node in cluster.nodes.items()
        if name != node_id
    )


async def test_a_refused_member_stays_dead_while_it_refutes(cluster: Cluster) -> None:
    await cluster.grow(4)
    await wait_for(cluster.all_alive, what="convergence")
    revoked = cluster.nodes["n3"]
    revoked.update_meta({MARK[0]: MARK[1]})
    await wait_for(
        lambda: all(
            (view := node.member("n3")) is not None and view.meta.get(MARK[0]) == MARK[1]
            for node in cluster.nodes.values()
        ),
        what="n3's mark everywhere",
    )
    for name in ("n0", "n1", "n2"):
        cluster.nodes[name].refuse("n3", "revoked", MARK)
    await wait_for(lambda: _refused_everywhere(cluster, "n3"), what="n3 refused")
    assert cluster.nodes["n0"].refusals() == {"n3": "revoked"}
    await wait_for(
        lambda: sum(cluster.nodes[n].refused_datagrams for n in ("n0", "n1", "n2")) > 5,
        what="n3's datagrams dropped",
    )
    await wait_for(
        lambda: all(cluster.state("n3", n) == MemberState.DEAD for n in ("n0", "n1", "n2")),
        what="n3 to see nobody answer",
    )
    # a third party's news of n3 alive, at a higher incarnation and with its old mark: ignored
    rumour = Message(
        MessageKind.GOSSIP,
        "n9",
        0,
        updates=(Update("n3", MemberState.ALIVE, 99, host(3), PORT, freeze_meta(dict([MARK]))),),
    )
    liar = cluster.network.endpoint("10.0.0.99", PORT, cluster="lab")
    await liar.start(lambda body, source: None)
    for index in range(3):
        liar.send(encode_message(rumour), (host(index), PORT))
    for _ in range(30):  # (an alive n3 would go dead again soon: it answers nobody)
        await asyncio.sleep(0.01)
        assert _refused_everywhere(cluster, "n3")
    assert cluster.nodes["n0"].member("n0").refused is None  # type: ignore[union-attr]
    cluster.nodes["n0"].refuse("n0", "revoked")  # itself: never
    assert cluster.nodes["n0"].refusals() == {"n3": "revoked"}


async def test_a_new_mark_or_allow_lets_a_refused_member_back(cluster: Cluster) -> None:
    await cluster.grow(3)
    await wait_for(cluster.all_alive, what="convergence")
    cluster.nodes["n2"].update_meta({MARK[0]: MARK[1]})
    await wait_for(
        lambda: (
            (view := cluster.nodes["n0"].member("n2")) is not None
            and view.meta.get(MARK[0]) == MARK[1]
        ),
        what="n2's mark at n0",
    )
    cluster.nodes["n0"].refuse("n2", "revoked", MARK)
    cluster.nodes["n1"].refuse("n2", "revoked", MARK)
    await wait_for(lambda: _refused_everywhere(cluster, "n2"), what="n2 refused")
    cluster.nodes["n2"].update_meta({MARK[0]: "2B"})  # a new certificate
    await wait_for(
        lambda: all(cluster.state(n, "n2") == MemberState.ALIVE for n in ("n0", "n1")),
        what="n2 back with its new mark",
    )
    assert cluster.nodes["n0"].refusals() == {}
    cluster.nodes["n0"].refuse("n1", "revoked")  # no mark: only allow() lifts it
    await wait_for(lambda: cluster.state("n0", "n1") == MemberState.DEAD, what="n1 refused")
    cluster.nodes["n0"].allow("n1")
    await wait_for(lambda: cluster.state("n0", "n1") == MemberState.ALIVE, what="n1 back")
