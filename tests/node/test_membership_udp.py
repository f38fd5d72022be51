"""UdpMembershipTransport and membership over real UDP sockets on 127.0.0.1 (port 0)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from config.timeouts import Timeouts
from node.membership.envelope import Envelope
from node.membership.service import Membership, UdpMembershipTransport
from node.membership.transport import MembershipTransport
from node.membership.types import EventKind, MemberEvent, MemberState

SECRET = b"test-cluster-secret-0123456789"
FAST = Timeouts(
    probe_interval_s=0.05,
    probe_timeout_s=0.02,
    indirect_probe_timeout_s=0.04,
    suspicion_s=0.15,
    dead_reap_s=30.0,
)
T = TypeVar("T")


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s"
        await asyncio.sleep(0.01)


async def test_signed_datagrams_pass_and_forged_ones_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="node.membership")
    received: list[tuple[bytes, tuple[str, int]]] = []
    receiver = UdpMembershipTransport("127.0.0.1", 0, secret=SECRET, cluster="lab")
    senders = {
        "good": UdpMembershipTransport("127.0.0.1", 0, secret=SECRET, cluster="lab"),
        "bad_mac": UdpMembershipTransport("127.0.0.1", 0, secret=b"another secret", cluster="lab"),
        "unsigned": UdpMembershipTransport("127.0.0.1", 0, secret=None, cluster="lab"),
        "cluster": UdpMembershipTransport("127.0.0.1", 0, secret=SECRET, cluster="other"),
        "stale": UdpMembershipTransport(
            "127.0.0.1", 0, secret=SECRET, cluster="lab", wall_clock=lambda: time.time() - 400
        ),
    }
    try:
        await receiver.start(lambda body, source: received.append((body, source)))
        target = receiver.local_address
        for name, sender in senders.items():
            await sender.start(lambda body, source: None)
            sender.send(name.encode(), target)
        good_port = senders["good"].local_address[1]
        await wait_for(lambda: sum(receiver.stats().dropped.values()) + len(received) >= 5)
        assert received == [(b"good", ("127.0.0.1", good_port))]
        stats = receiver.stats()
        assert dict(stats.dropped) == {"bad_mac": 1, "unsigned": 1, "cluster": 1, "stale": 1}
        assert stats.received_datagrams == 1
        assert senders["good"].stats().sent_datagrams == 1
        assert any("dropped a membership datagram" in r.getMessage() for r in caplog.records)
        dropped = [r for r in caplog.records if "dropped" in r.message]
        assert all(r.levelno == logging.DEBUG for r in dropped if "of cluster" not in r.message)
    finally:
        for transport in [receiver, *senders.values()]:
            await transport.close()
            await transport.close()


async def test_datagrams_of_another_cluster_are_dropped_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="node.membership")
    received: list[bytes] = []
    receiver = UdpMembershipTransport("127.0.0.1", 0, secret=None, cluster="dev-aaaa")
    foreign = UdpMembershipTransport("127.0.0.1", 0, secret=None, cluster="dev-bbbb")
    try:
        await receiver.start(lambda body, source: received.append(body))
        await foreign.start(lambda body, source: None)
        for index in range(3):
            foreign.send(b"ping %d" % index, receiver.local_address)
        await wait_for(lambda: receiver.stats().dropped.get("cluster", 0) == 3)
        assert received == []
        assert receiver.stats().received_datagrams == 0
        about = [r for r in caplog.records if "of cluster 'dev-bbbb'" in r.getMessage()]
        assert [r.levelno for r in about] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
        assert "this node is of cluster 'dev-aaaa'" in about[0].getMessage()
    finally:
        await receiver.close()
        await foreign.close()


@pytest.mark.parametrize("secret", [SECRET, None])
async def test_a_datagram_without_a_cluster_id_is_accepted_as_ours(
    secret: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer of a release before cluster ids names none: it is taken as ours (rolling upgrade)."""
    caplog.set_level(logging.DEBUG, logger="node.membership")
    received: list[bytes] = []
    receiver = UdpMembershipTransport("127.0.0.1", 0, secret=secret, cluster="lab")
    datagram = Envelope("lab", secret).seal(b"old peer", time.time(), boot=5, seq=1)
    unlabelled = datagram.replace(b'"c":"lab",', b"", 1)
    assert unlabelled != datagram
    try:
        await receiver.start(lambda body, source: received.append(body))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(unlabelled, receiver.local_address)
            await wait_for(lambda: received == [b"old peer"])
        assert receiver.stats().dropped == {}
        noted = [r for r in caplog.records if "name no cluster id" in r.getMessage()]
        assert [r.levelno for r in noted] == [logging.DEBUG]
    finally:
        await receiver.close()


async def test_a_captured_datagram_replayed_is_refused_and_a_restarted_sender_is_accepted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="node.membership")
    loop = asyncio.get_running_loop()
    received: list[bytes] = []
    receiver = UdpMembershipTransport("127.0.0.1", 0, secret=SECRET, cluster="lab")
    sender = UdpMembershipTransport("127.0.0.1", 0, secret=SECRET, cluster="lab")
    restarted: UdpMembershipTransport | None = None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as wiretap:
        wiretap.bind(("127.0.0.1", 0))
        wiretap.setblocking(False)
        try:
            await receiver.start(lambda body, source: received.append(body))
            await sender.start(lambda body, source: None)
            target = receiver.local_address
            sender.send(b"ping-1", wiretap.getsockname())  # the attacker captures it on the way
            captured, _ = await asyncio.wait_for(loop.sock_recvfrom(wiretap, 2048), 5)
            wiretap.sendto(captured, target)  # ... delivers it once
            await wait_for(lambda: received == [b"ping-1"])
            for _ in range(3):
                wiretap.sendto(captured, target)  # ... and replays it
            await wait_for(lambda: receiver.stats().dropped.get("replayed", 0) == 3)
            sender.send(b"ping-2", target)
            await wait_for(lambda: received == [b"ping-1", b"ping-2"])

            port = sender.local_address[1]
            await sender.close()
            restarted = UdpMembershipTransport("127.0.0.1", port, secret=SECRET, cluster="lab")
            await restarted.start(lambda body, source: None)
            restarted.send(b"ping-1 again", target)  # sequence numbers start over
            await wait_for(lambda: received[-1:] == [b"ping-1 again"])
            wiretap.sendto(captured, target)  # the old life's datagram is still a replay
            await wait_for(lambda: receiver.stats().dropped.get("replayed", 0) == 4)
            assert received == [b"ping-1", b"ping-2", b"ping-1 again"]
            assert dict(receiver.stats().dropped) == {"replayed": 4}
            refusals = [r for r in caplog.records if "replayed" in r.getMessage()]
            assert len(refusals) == 4
            assert all(r.levelno == logging.DEBUG for r in refusals)
        finally:
            for transport in (receiver, sender, restarted):
                if transport is not None:
                    await transport.close()


async def start_node(name: str, timeouts: Timeouts, seed_port: int | None) -> Membership:
    transport = UdpMembershipTransport("127.0.0.1", 0, secret=SECRET, cluster="lab")
    _, port = await transport.bind()
    node = Membership(
        name,
        "127.0.0.1",
        port,
        {"role": "training"},
        transport,
        timeouts,
        cluster="lab",
        rng=random.Random(name),
    )
    await node.start()
    if seed_port is not None:
        node.add_candidate("127.0.0.1", seed_port)
    return node


def port_of(node: Membership) -> int:
    view = node.member(node.self_id)
    assert view is not None
    return view.port


async def test_udp_cluster_converges_and_detects_a_closed_member() -> None:
    first = await start_node("u0", FAST, None)
    nodes = [first]
    try:
        nodes += [await start_node(f"u{i}", FAST, port_of(first)) for i in (1, 2)]
        await wait_for(lambda: all(n.counts()["alive"] == 3 for n in nodes))
        assert nodes[2].transport_stats().dropped == {}
        await nodes[2].close()
        await wait_for(
            lambda: all(n.member("u2").state == MemberState.DEAD for n in nodes[:2])  # type: ignore[union-attr]
        )
    finally:
        for node in nodes:
            await node.close()


class NodeThread(threading.Thread):
    """One member with its own event loop in its own thread, so its loop can stall alone."""

    def __init__(self, name: str, timeouts: Timeouts) -> None:
        super().__init__(name=f"member-{name}", daemon=True)
        self.node_name = name
        self.timeouts = timeouts
        self.ready = threading.Event()
        self.events: list[MemberEvent] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.node: Membership | None = None
        self.port = 0
        self._stop_requested: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        node = await start_node(self.node_name, self.timeouts, None)
        self.node, self.port = node, port_of(node)
        node.add_listener(self.events.append)
        self.ready.set()
        try:
            await self._stop_requested.wait()
        finally:
            await node.close()

    def call(self, function: Callable[[], T]) -> T:
        """Run `function` on this member's loop and return its result."""
        assert self.loop is not None
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(function())
            except Exception as exc:
                result.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return result.result(timeout=10)

    def stop(self) -> None:
        assert self.loop is not None
        assert self._stop_requested is not None
        self.loop.call_soon_threadsafe(self._stop_requested.set)
        self.join(timeout=10)


def poll(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s"
        time.sleep(0.02)


def test_one_member_stalling_for_a_second_declares_no_healthy_peer_failed() -> None:
    timeouts = Timeouts(
        probe_interval_s=0.1, probe_timeout_s=0.05, indirect_probe_timeout_s=0.1, suspicion_s=0.3
    )
    threads = [NodeThread(f"s{i}", timeouts) for i in range(3)]
    try:
        for thread in threads:
            thread.start()
            assert thread.ready.wait(10)
        for thread in threads[1:]:
            thread.call(lambda t=thread: t.node.add_candidate("127.0.0.1", threads[0].port))  # type: ignore[union-attr]

        def all_alive() -> bool:
            return all(t.call(lambda t=t: t.node.counts()["alive"]) == 3 for t in threads)  # type: ignore[union-attr]

        poll(all_alive, 10)
        stalled, healthy = threads[0], threads[1:]
        marks = [len(t.events) for t in threads]
        assert stalled.loop is not None
        stalled.loop.call_soon_threadsafe(time.sleep, 1.0)  # block s0's event loop for 1 s
        time.sleep(1.0)
        poll(all_alive, 10)  # s0 is back; the others may have declared it dead meanwhile

        def failures(thread: NodeThread, mark: int, about: set[str]) -> list[Any]:
            kinds = {EventKind.SUSPECT, EventKind.DEAD}
            return [
                (e.kind, e.member.node_id)
                for e in thread.events[mark:]
                if e.kind in kinds and e.member.node_id in about
            ]

        assert failures(stalled, marks[0], {"s1", "s2"}) == []
        assert failures(healthy[0], marks[1], {"s2"}) == []
        assert failures(healthy[1], marks[2], {"s1"}) == []
        assert stalled.call(lambda: stalled.node.stall_count) >= 1  # type: ignore[union-attr]
    finally:
        for thread in threads:
            if thread.is_alive():
                thread.stop()


def test_transport_is_the_seam() -> None:
    transport: MembershipTransport = UdpMembershipTransport(
        "127.0.0.1", 0, secret=None, cluster="lab"
    )
    assert transport.cluster == "lab"
    assert 1000 < transport.body_budget < 1400
