"""A node serves only its own cluster: a request naming another cluster id (X-Shoal-Cluster) is
refused with 403 naming both ids, signed or not; one naming none (a client, a release before
cluster ids) is served."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from config import HEADER_CLUSTER, load_inventory, load_settings, peer_middlewares, signed_headers
from node.boot import inventory_cluster_name
from node.daemon import NodeDaemon
from node.election.messages import VoteRequest
from node.election.transport import HttpElectionTransport
from node.runtime import NodeRuntime
from tests.node.daemons import test_settings

SECRET = b"cluster-identity-test-secret-0123456789"


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)


async def _status(port: int, secret: bytes | None, cluster: str | None) -> tuple[int, Any]:
    middlewares = peer_middlewares(secret, "b", cluster)
    url = f"http://127.0.0.1:{port}/v1/status"
    async with ClientSession(middlewares=middlewares) as session, session.get(url) as response:
        return response.status, await response.json()


def test_peer_middlewares_name_the_cluster_signed_or_not() -> None:
    assert len(peer_middlewares(SECRET, "a", "lab")) == 1
    assert len(peer_middlewares(None, "a", "lab")) == 1
    assert peer_middlewares(None, "a", None) == ()
    headers = signed_headers(SECRET, "a", "GET", "/v1/status", cluster="lab")
    assert headers[HEADER_CLUSTER] == "lab"
    assert HEADER_CLUSTER not in signed_headers(SECRET, "a", "GET", "/v1/status")


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "dev-mode"])
async def test_a_request_of_another_cluster_is_refused_naming_both_ids(
    tmp_path: Path, signed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="node.security")
    flags: dict[str, Any] = {"cluster_name": "lab-a", "voters": ["a", "b"]}
    secret = SECRET if signed else None
    if signed:
        path = tmp_path / "secret"
        path.write_bytes(SECRET)
        path.chmod(0o600)
        flags["secret_file"] = path
    async with NodeDaemon(test_settings(tmp_path, "a", **flags)) as daemon:
        for _ in range(2):
            status, body = await _status(daemon.port, secret, "lab-b")
            assert status == 403, body
            assert body["error"] == "wrong_cluster"
            assert body["status"] == 403
            assert "'lab-b'" in body["reason"]
            assert "'lab-a'" in body["reason"]
            assert (body["cluster"], body["sender_cluster"]) == ("lab-a", "lab-b")
        status, body = await _status(daemon.port, secret, "lab-a")
        assert status == 200, body
        assert body["cluster"] == "lab-a"
        status, body = await _status(daemon.port, secret, None)  # a release before cluster ids
        assert status == 200, body
    refused = [r for r in caplog.records if "of cluster 'lab-b'" in r.getMessage()]
    assert [r.levelno for r in refused] == [logging.WARNING, logging.DEBUG]
    unlabelled = [r for r in caplog.records if "names no cluster id" in r.getMessage()]
    assert unlabelled
    assert all(r.levelno == logging.DEBUG for r in unlabelled)


def _coordinator(runtime: NodeRuntime) -> str | None:
    runtime.refresh()
    return runtime.coordinator


async def test_a_node_of_another_cluster_is_never_a_member_or_a_voter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Voters a, b, c; b is of another cluster and joins through a's address: a and c elect a
    coordinator without it, and neither side lists the other as a member."""
    caplog.set_level(logging.WARNING, logger="node.membership")
    voters = ["a", "b", "c"]
    async with NodeDaemon(test_settings(tmp_path, "a", cluster_name="lab", voters=voters)) as a:
        seeds = (f"127.0.0.1:{a.port}",)
        c_settings = test_settings(tmp_path, "c", cluster_name="lab", voters=voters, seeds=seeds)
        b_settings = test_settings(tmp_path, "b", cluster_name="other", voters=voters, seeds=seeds)
        async with NodeDaemon(b_settings) as b, NodeDaemon(c_settings) as c:
            assert a.runtime is not None
            assert b.runtime is not None
            assert c.runtime is not None
            runtimes = (a.runtime, b.runtime, c.runtime)
            membership_a = a.runtime.membership
            assert membership_a is not None
            await _until(
                lambda: membership_a.transport_stats().dropped.get("cluster", 0) >= 1,
                10,
                "a to drop a datagram of b's cluster",
            )
            await _until(
                lambda: (
                    _coordinator(runtimes[0]) in {"a", "c"}
                    and _coordinator(runtimes[0]) == _coordinator(runtimes[2])
                ),
                30,
                "a and c to agree on a coordinator",
            )
            views = {
                r.node_id: {m.node_id for m in r.membership.members()}
                for r in runtimes
                if r.membership is not None
            }
            assert views == {"a": {"a", "c"}, "b": {"b"}, "c": {"a", "c"}}
            assert _coordinator(b.runtime) is None
    refused = [r for r in caplog.records if "of cluster 'other'" in r.getMessage()]
    assert len(refused) == 1
    assert "this node is of cluster 'lab'" in refused[0].getMessage()


def test_a_default_cluster_id_with_mdns_on_is_warned_and_the_inventory_names_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="node.boot")
    unnamed = load_settings(env={}, flags={"data_dir": tmp_path, "mdns": True}).settings
    assert inventory_cluster_name(unnamed, None).cluster_name == "shoal"
    assert "the cluster id is the default 'shoal' and mDNS is on" in caplog.text
    caplog.clear()
    inventory_path = tmp_path / "hosts.yaml"
    inventory_path.write_text("cluster: {name: lab}\nhosts:\n  a: {ssh_host: 127.0.0.1}\n")
    named = inventory_cluster_name(unnamed, load_inventory(inventory_path))
    assert named.cluster_name == "lab"
    quiet = inventory_cluster_name(unnamed.model_copy(update={"mdns": False}), None)
    assert quiet.cluster_name == "shoal"
    assert caplog.text == ""


@pytest.mark.parametrize("secret", [SECRET, None], ids=["signed", "dev-mode"])
async def test_vote_requests_name_the_cluster_and_another_cluster_refuses_them(
    tmp_path: Path, secret: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="node.security")
    flags: dict[str, Any] = {"cluster_name": "lab", "voters": ["a", "b"]}
    if secret is not None:
        path = tmp_path / "secret"
        path.write_bytes(secret)
        path.chmod(0o600)
        flags["secret_file"] = path
    async with NodeDaemon(test_settings(tmp_path, "a", **flags)) as node:
        target = ("127.0.0.1", node.port)
        for cluster, answered in (("other", False), ("lab", True), (None, True)):
            async with HttpElectionTransport(
                "b", lambda _: target, secret=secret, timeout_s=5.0, cluster=cluster
            ) as transport:
                reply = await transport.request_vote("a", VoteRequest(1, "b", pre_vote=True))
            assert (reply is not None) == answered, cluster
    assert "refused requests from 127.0.0.1 of cluster 'other'" in caplog.text
