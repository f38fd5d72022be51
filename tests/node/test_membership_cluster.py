"""Whole clusters of the real membership code over InMemoryNetwork, with shrunk timing."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator

import pytest

from node.membership.service import InMemoryNetwork
from node.membership.types import EventKind, MemberState, Update, freeze_meta
from node.membership.wire import Message, MessageKind, encode_message
from tests.node.membership_sim import (
    FAILED,
    FAST,
    PORT,
    Cluster,
    host,
    in_indirect_probe,
    running_cluster,
    wait_for,
)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with running_cluster() as built:
        yield built


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


async def test_a_member_known_without_meta_gets_it_by_push_pull(cluster: Cluster) -> None:
    """n1 holds n0 as a placeholder (no meta) while its view otherwise matches everyone's:
    nothing about n0 changes, so no gossip carries n0's meta, and only a push-pull that the
    meta-less view asks for brings it (the marked digest; node.membership.rules.view_digest)."""
    await cluster.grow(3)
    await wait_for(cluster.all_alive, what="convergence")
    await wait_for(
        lambda: all(not len(node._queue) for node in cluster.nodes.values()),
        what="every join's gossip sent its last time",
    )
    n1 = cluster.nodes["n1"]
    table = n1._table  # the state a message without n0's record leaves
    known = table.get("n0")
    assert known is not None
    assert dict(known.meta)
    table.store(known, dataclasses.replace(known, meta=freeze_meta({})))
    assert not dict(table.get("n0").meta)  # type: ignore[union-attr]
    await wait_for(
        lambda: (view := n1.member("n0")) is not None and view.meta.get("index") == 0,
        what="n0's meta back at n1",
    )


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
