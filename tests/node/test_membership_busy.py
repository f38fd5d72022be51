"""A member that is busy is not dead: one whose datagrams wait behind a saturated uplink is never
declared dead by peers whose probes time out, and still dies at once when it crashes; the rules
that make it so, and the socket marks that keep membership datagrams out of the bulk queue."""

from __future__ import annotations

import asyncio
import random
import socket
import time

from config.timeouts import Timeouts
from node.membership.rules import Suspicion, suspicion_longest
from node.membership.service import (
    InMemoryNetwork,
    Membership,
    SwimTuning,
    UdpMembershipTransport,
)
from node.membership.timers import AckTable, RelayWait
from node.membership.types import EventKind, MemberState
from node.membership.udp import DSCP_CS6, SOCKET_PRIORITY
from tests.node.membership_sim import FAST, PORT, Cluster, host, wait_for

QUEUE_S = 0.2
"""How long the busy member's datagrams wait: longer than a probe and its indirect probes
(0.06 s at FAST timing) and than a confirmed suspicion (0.15 s), shorter than an unconfirmed
one (0.45 s)."""
BUSY_S = 3.0


async def test_a_member_behind_a_saturated_uplink_is_never_dead_and_still_dies_on_a_crash() -> None:
    network = InMemoryNetwork(random.Random(5), delay_s=0.0005, jitter_s=0.0005)
    cluster = Cluster(network)
    try:
        await cluster.grow(3)
        await wait_for(cluster.all_alive, what="convergence")
        assert FAST.probe_timeout_s + FAST.indirect_probe_timeout_s < QUEUE_S
        assert FAST.suspicion_s < QUEUE_S
        network.saturate(host(0), QUEUE_S)
        await asyncio.sleep(BUSY_S)
        probes = BUSY_S / (2 * FAST.probe_interval_s)  # of n0 by each peer, about 30
        for name in ("n1", "n2"):
            assert not cluster.seen(name, "n0", {EventKind.DEAD}), cluster.events[name]
            # Its acks are all late, but its own messages arrive during most probes: those end
            # acked, and few are suspicions it has to refute (every one without that rule).
            assert len(cluster.seen(name, "n0", {EventKind.SUSPECT})) < probes / 4
            assert cluster.nodes[name].event_counts().get("dead", 0) == 0
        network.saturate(host(0), 0.0)
        await wait_for(cluster.all_alive, what="all alive once the uplink drains")
        await cluster.crash("n0")
        await wait_for(
            lambda: cluster.all_see("n0", MemberState.DEAD), what="the crashed member dead"
        )
        assert [cluster.nodes[name].event_counts()["dead"] for name in ("n1", "n2")] == [1, 1]
    finally:
        await cluster.close()
        network.close()


def _suspicion(started_at: float) -> Suspicion:
    return Suspicion("n0", 3, started_at, "n1", frozenset({"n2"}), 1, 0.6, 1.8)


def test_a_suspect_heard_from_since_gets_the_unconfirmed_timeout() -> None:
    suspicion = _suspicion(started_at=10.0)
    assert suspicion.deadline == 10.6  # confirmed: the shortest
    assert suspicion_longest(suspicion, heard_at=None, now=10.6) == 0.0
    assert suspicion_longest(suspicion, heard_at=9.9, now=10.6) == 0.0  # before: no evidence
    assert round(suspicion_longest(suspicion, heard_at=10.2, now=10.6), 6) == 1.2
    assert suspicion_longest(suspicion, heard_at=11.0, now=11.9) == 0.0  # at its longest: dead


async def test_a_message_from_the_target_ends_its_probes_and_the_relays_to_it() -> None:
    acks = AckTable(random.Random(1))
    _, probe = acks.expect("n0")
    expired: list[RelayWait] = []
    acks.relay("n0", ("10.0.0.9", PORT), 77, 5.0, expired.append)
    _, other = acks.expect("n5")
    relays = acks.heard("n0")
    assert probe.future.done()
    assert probe.future.result() == "n0"
    assert [(r.target, r.origin_seq) for r in relays] == [("n0", 77)]
    assert not other.future.done()
    assert acks.heard("n0") == []  # the relay's wait is over: no nack later either
    acks.close()
    assert not expired


async def test_membership_datagrams_are_marked_network_control_and_first_band() -> None:
    transport = UdpMembershipTransport("127.0.0.1", 0, secret=b"s" * 32, cluster="lab")
    await transport.bind()
    try:
        sock = transport._transport.get_extra_info("socket")  # type: ignore[union-attr]  # test peeks at its socket
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY) == SOCKET_PRIORITY
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == DSCP_CS6
    finally:
        await transport.close()


async def test_a_suspect_hears_of_its_suspicion_from_the_suspecter_at_once() -> None:
    # No eager gossip and a probe period far longer than the suspicion: without a direct notice
    # the suspect would hear of it only at the suspecter's next probe, a period later.
    slow = Timeouts(
        probe_interval_s=1.0,
        probe_timeout_s=0.02,
        indirect_probe_timeout_s=0.04,
        suspicion_s=0.15,
    )
    network = InMemoryNetwork(random.Random(3), delay_s=0.0005)
    members = []
    try:
        for index in range(2):
            endpoint = network.endpoint(host(index), PORT, cluster="lab")
            member = Membership(
                f"n{index}", host(index), PORT, {}, endpoint, slow, cluster="lab",
                rng=random.Random(index), tuning=SwimTuning(gossip_fanout=0),
            )  # fmt: skip
            await member.start()
            members.append(member)
        members[1].add_candidate(host(0), PORT)
        await wait_for(lambda: all(m.counts()["alive"] == 2 for m in members), what="joined")
        suspected: list[float] = []
        members[1].add_listener(
            lambda event: (
                suspected.append(time.monotonic()) if event.kind == EventKind.SUSPECT else None
            )
        )
        network.cut(host(0), host(1))  # n1 no longer hears n0: its next probe fails
        await wait_for(lambda: bool(suspected), timeout_s=5.0, what="n1 to suspect n0")
        await wait_for(lambda: members[0].incarnation >= 1, timeout_s=5.0, what="n0 to refute")
        assert time.monotonic() - suspected[0] < slow.probe_interval_s / 2
    finally:
        for member in members:
            await member.close()
        network.close()
