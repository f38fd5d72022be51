"""mDNS discovery with real zeroconf on 127.0.0.1 (dev mode), in one process and across two.

Every test uses its own cluster name and node ids, so parallel runs on this host do not meet.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from zeroconf import _core as zeroconf_core

from config import Timeouts
from node.discovery.candidates import Advert, Candidate
from node.discovery.feed import Discovery
from tests.cluster.fixtures import REQUIRE_NETNS_ENV

ROOT = Path(__file__).resolve().parents[2]
FAST = Timeouts(mdns_s=2.0)
LOOPBACK = "127.0.0.1"
# zeroconf's own registration timing, shrunk (probe 3 x 500 ms, announce 3 x 225 ms).
FAST_ZEROCONF = {
    "_CHECK_TIME": 10,
    "_REGISTER_TIME": 20,
    "_UNREGISTER_TIME": 20,
    "_PROBE_RANDOM_DELAY_INTERVAL": (1, 5),
}


def _loopback_multicast_problem() -> str | None:
    """Why multicast on 127.0.0.1 does not reach this host's own sockets, or None when it does."""
    group = "224.0.0.251"
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender,
    ):
        try:
            receiver.bind(("", 0))
            receiver.settimeout(1.0)
            membership = socket.inet_aton(group) + socket.inet_aton(LOOPBACK)
            receiver.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
            sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(LOOPBACK))
            sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, struct.pack("B", 1))
            sender.sendto(b"shoal", (group, receiver.getsockname()[1]))
            receiver.recv(16)
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
    return None


def require_loopback_multicast(problem: str | None) -> None:
    """Skip with `problem` as the reason, or fail when CI requires these tests to run."""
    if problem is None:
        return
    if os.environ.get(REQUIRE_NETNS_ENV) == "1":
        pytest.fail(f"mDNS tests need multicast on {LOOPBACK}: {problem} ({REQUIRE_NETNS_ENV}=1)")
    pytest.skip(f"mDNS tests need multicast on {LOOPBACK} to reach this host: {problem}")


@pytest.fixture(scope="module", autouse=True)
def _needs_loopback_multicast() -> None:
    require_loopback_multicast(_loopback_multicast_problem())


def test_missing_multicast_skips_with_its_reason_or_fails_when_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcomes = (pytest.skip.Exception, pytest.fail.Exception)
    require_loopback_multicast(None)
    monkeypatch.delenv(REQUIRE_NETNS_ENV, raising=False)
    with pytest.raises(outcomes) as skipped:
        require_loopback_multicast("no route")
    assert skipped.type is pytest.skip.Exception
    assert str(skipped.value) == (
        "mDNS tests need multicast on 127.0.0.1 to reach this host: no route"
    )
    monkeypatch.setenv(REQUIRE_NETNS_ENV, "1")
    with pytest.raises(outcomes) as failed:
        require_loopback_multicast("no route")
    assert failed.type is pytest.fail.Exception
    assert str(failed.value) == (
        "mDNS tests need multicast on 127.0.0.1: no route (SHOAL_REQUIRE_NETNS=1)"
    )


@pytest.fixture(autouse=True)
def _fast_zeroconf(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in FAST_ZEROCONF.items():
        monkeypatch.setattr(zeroconf_core, name, value)


@pytest.fixture
def cluster() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _advert(name: str, cluster: str, port: int) -> Advert:
    return Advert(f"{name}-{uuid.uuid4().hex[:8]}", cluster, "0.1.0", port, (LOOPBACK,))


@contextlib.asynccontextmanager
async def _node(
    advert: Advert, seen: list[Candidate] | None = None, refeed_interval_s: float = 10.0
) -> AsyncIterator[Discovery]:
    sink = seen if seen is not None else []
    async with Discovery(
        advert,
        sink.append,
        mdns=True,
        inventory=None,
        seeds=[],
        timeouts=FAST,
        interfaces=[LOOPBACK],
        refeed_interval_s=refeed_interval_s,
    ) as discovery:
        yield discovery


async def _wait_until(predicate: Callable[[], bool], timeout_s: float = 8.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_two_nodes_find_each_other_and_ignore_themselves(cluster: str) -> None:
    a, b = _advert("a", cluster, 9001), _advert("b", cluster, 9002)
    seen_a: list[Candidate] = []
    seen_b: list[Candidate] = []
    async with _node(a, seen_a, refeed_interval_s=0.02) as node_a, _node(b, seen_b) as node_b:
        assert node_a.mdns_active
        assert node_b.mdns_active
        await _wait_until(lambda: b.node_id in node_a.mdns_peers())
        await _wait_until(lambda: a.node_id in node_b.mdns_peers())
        from_b = Candidate(LOOPBACK, 9002, "mdns", b.node_id)
        assert node_a.mdns_peers() == {b.node_id: from_b}
        assert Candidate(LOOPBACK, 9001, "mdns", a.node_id) in seen_b
        await _wait_until(lambda: seen_a.count(from_b) >= 3)  # current peers are re-fed
    assert {c.node_id for c in seen_a} == {b.node_id}
    assert {c.node_id for c in seen_b} == {a.node_id}


async def test_advert_of_another_cluster_is_ignored(
    cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="node.discovery.mdns")
    a, stranger = _advert("a", cluster, 9001), _advert("x", f"{cluster}-other", 9009)
    seen: list[Candidate] = []
    async with _node(a, seen) as node_a, _node(stranger):
        await _wait_until(lambda: stranger.node_id in caplog.text)
        assert "ignoring mDNS advert" in caplog.text
        assert node_a.mdns_peers() == {}
    assert seen == []


async def test_goodbye_is_seen_and_only_logged(
    cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="node.discovery.mdns")
    a, b = _advert("a", cluster, 9001), _advert("b", cluster, 9002)
    seen: list[Candidate] = []
    async with _node(a, seen) as node_a:
        async with _node(b):
            await _wait_until(lambda: b.node_id in node_a.mdns_peers())
        await _wait_until(lambda: b.node_id not in node_a.mdns_peers())
        assert f"mDNS advert of {b.node_id} withdrawn" in caplog.text
    assert {c.node_id for c in seen} == {b.node_id}


async def test_update_advert_propagates(cluster: str) -> None:
    a, b = _advert("a", cluster, 9001), _advert("b", cluster, 9002)
    seen: list[Candidate] = []
    async with _node(a, seen) as node_a, _node(b) as node_b:
        await _wait_until(lambda: b.node_id in node_a.mdns_peers())
        await node_b.update_advert(dataclasses.replace(b, port=9102, version="0.2.0"))
        assert node_b.advert.port == 9102
        await _wait_until(lambda: node_a.mdns_peers()[b.node_id].port == 9102)
        with pytest.raises(ValueError, match="node id cannot change"):
            await node_b.update_advert(dataclasses.replace(b, node_id="someone-else"))
    assert Candidate(LOOPBACK, 9102, "mdns", b.node_id) in seen


CHILD = """
import asyncio, sys
from zeroconf import _core
from config import Timeouts
from node.discovery.feed import Discovery
from tests.cluster.fixtures import REQUIRE_NETNS_ENV
from node.discovery.candidates import Advert

for name, value in {fast!r}.items():
    setattr(_core, name, value)

async def main():
    advert = Advert({node_id!r}, {cluster!r}, "0.1.0", 9005, ("127.0.0.1",))
    async with Discovery(advert, print, mdns=True, inventory=None, seeds=[],
                         timeouts=Timeouts(mdns_s=2.0), interfaces=["127.0.0.1"]):
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


async def test_nodes_in_two_processes_find_each_other(cluster: str) -> None:
    a, child_id = _advert("a", cluster, 9001), f"child-{uuid.uuid4().hex[:8]}"
    code = CHILD.format(fast=FAST_ZEROCONF, node_id=child_id, cluster=cluster)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        async with _node(a) as node_a:
            # The child may find node a before it prints "ready": collect every line it prints.
            lines: list[bytes] = []

            async def read_until(predicate: Callable[[list[bytes]], bool], limit_s: float) -> None:
                async def loop() -> None:
                    while not predicate(lines):
                        line = await child.stdout.readline()  # type: ignore[union-attr]
                        assert line, f"the child exited early after printing {lines!r}"
                        lines.append(line)

                await asyncio.wait_for(loop(), limit_s)

            await read_until(lambda seen: b"ready\n" in seen, 15)
            await _wait_until(lambda: child_id in node_a.mdns_peers())
            assert node_a.mdns_peers()[child_id] == Candidate(LOOPBACK, 9005, "mdns", child_id)
            await read_until(lambda seen: any(a.node_id.encode() in line for line in seen), 8)
            child.stdin.close()
            assert await asyncio.wait_for(child.wait(), 10) == 0
            await _wait_until(lambda: child_id not in node_a.mdns_peers())
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
