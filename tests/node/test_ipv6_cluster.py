"""A cluster on IPv6 (issue 35 item 5): three `shoal serve` daemons as separate processes on
`::1`, each on its own port, seeded with `[::1]:PORT`, signed with a cluster secret.

Every URL a node makes for a peer here comes from net.peer_url; a hand-made `http://::1:PORT`
breaks the membership view, the coordinator's plan, the file sync, a job's daemon URL and the
gang's member starts. The test proves: every node sees 3 alive members at `::1`, one
coordinator for all, a file of the models/ category written on one node reaches both others,
a job started through another node's API (found in the first node's peer view) runs there with
SHOAL_DAEMON_URL `http://[::1]:PORT`, and a gang of 3 runs one rank on each node.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from net import peer_url
from tests.cluster.cluster import LoopbackCluster
from tests.cluster.fixtures import LoopbackClusterFactory
from tests.node.jobs.helpers import JobClient, signed_session, write_secret

ROOT = Path(__file__).resolve().parents[2]
TIMEOUTS = {
    "heartbeat_interval_s": 0.1,
    "lease_s": 0.8,
    "election_min_s": 0.8,
    "election_max_s": 1.6,
    "probe_interval_s": 0.3,
    "probe_timeout_s": 0.15,
    "indirect_probe_timeout_s": 0.3,
    "suspicion_s": 0.6,
}
REPORT = (
    "import os\n"
    "keys = ['SHOAL_JOB_ID', 'SHOAL_NODE_RANK', 'SHOAL_NODES_NUM', 'MASTER_ADDR', "
    "'SHOAL_DAEMON_URL']\n"
    "print(' '.join(os.environ.get(k, '-') for k in keys), flush=True)\n"
)
WEIGHTS = b"ipv6 weights " * 1000


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback (::1) here")


def serve(cluster: LoopbackCluster, tmp_path: Path) -> None:
    """Start a daemon on each host of `cluster`, all bound to the hosts' address (::1)."""
    secret = write_secret(tmp_path)
    names = [host.name for host in cluster.hosts]
    for host in cluster.hosts:
        settings = {
            "node_id": host.name,
            "data_dir": str(host.data_dir),
            "bind": host.address,
            "port": host.port,
            "mdns": False,
            "cluster_name": f"v6{os.getpid()}",
            "voters": names,
            "seeds": [other.endpoint for other in cluster.hosts if other is not host],
            "secret_file": str(secret),
            "role": "training",
            "backend": "gloo",
            "gpus": "none",
            "sync_interval_s": 0.3,
            "timeouts": TIMEOUTS,
        }
        config = host.data_dir / "shoal.yaml"
        config.write_text(yaml.safe_dump(settings))
        env = {"SHOAL_CONFIG": str(config), "PYTHONPATH": str(ROOT)}
        host.spawn([sys.executable, "-m", "node.cli", "serve"], env=env, cwd=ROOT, name="shoal")


async def status_of(client: JobClient) -> dict[str, Any] | None:
    try:
        code, status = await client.call("GET", "/v1/status")
    except OSError:
        return None
    return status if code == 200 else None


async def agreed(clients: dict[str, JobClient], timeout_s: float = 60.0) -> dict[str, Any]:
    """Every node's status once all see 3 alive members and one coordinator, term and plan."""
    deadline = time.monotonic() + timeout_s
    seen: list[dict[str, Any] | None] = []
    while time.monotonic() < deadline:
        seen = [await status_of(client) for client in clients.values()]
        if all(status is not None for status in seen):
            fences = {(s["coordinator"], s["term"], s["plan_version"]) for s in seen if s}
            alive = {s["members"]["alive"] for s in seen if s}
            if len(fences) == 1 and None not in next(iter(fences)) and alive == {3}:
                return dict(zip(clients, seen, strict=True))
        await asyncio.sleep(0.2)
    raise AssertionError(f"the IPv6 cluster did not agree on a coordinator and plan: {seen}")


async def synced(paths: list[Path], timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(path.exists() and path.read_bytes() == WEIGHTS for path in paths):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"models/ file not synced to {[p for p in paths if not p.exists()]}")


async def stop_jobs(clients: dict[str, JobClient]) -> None:
    """Kill any job still running (a failed assertion must not leave processes behind)."""
    for client in clients.values():
        try:
            _, listing = await client.call("GET", "/v1/jobs?state=running")
            for job in listing.get("jobs", []):
                await client.call("POST", f"/v1/jobs/{job['job_id']}/kill", json={"signal": "KILL"})
        except OSError:
            continue


@pytest.fixture
async def ipv6_nodes(
    loopback_cluster: LoopbackClusterFactory, tmp_path: Path
) -> AsyncIterator[tuple[LoopbackCluster, dict[str, JobClient]]]:
    cluster = loopback_cluster(3, host="::1")
    serve(cluster, tmp_path)
    async with signed_session() as session:
        clients = {h.name: JobClient(peer_url(h.address, h.port), session) for h in cluster.hosts}
        try:
            yield cluster, clients
        finally:
            await stop_jobs(clients)


async def one_job(client: JobClient, spec: dict[str, Any]) -> dict[str, Any]:
    status, job = await client.call("POST", "/v1/jobs", json=spec)
    assert status == 201, job
    done = await client.wait(spec["job_id"], timeout_s=60)
    assert done["state"] == "succeeded", done
    return done


@pytest.mark.timeout(150)
async def test_three_nodes_on_ipv6_loopback_agree_sync_and_run_jobs_and_a_gang(
    ipv6_nodes: tuple[LoopbackCluster, dict[str, JobClient]],
) -> None:
    cluster, clients = ipv6_nodes
    statuses = await agreed(clients)
    assert {s["coordinator"] for s in statuses.values()} <= set(clients)
    ports = {host.name: host.port for host in cluster.hosts}
    _, peers = await clients["h0"].call("GET", "/v1/peers")
    view = {m["node_id"]: (m["address"], m["port"], m["state"]) for m in peers["members"]}
    assert view == {name: ("::1", port, "alive") for name, port in ports.items()}

    source = cluster.hosts[0].data_dir / "models" / "v6" / "weights.bin"
    source.parent.mkdir(parents=True)
    source.write_bytes(WEIGHTS)
    await synced([host.data_dir / "models" / "v6" / "weights.bin" for host in cluster.hosts[1:]])

    # A job on another node: its address comes from h0's peer view, its URL from net.peer_url.
    address, port, _ = view["h2"]
    other = JobClient(peer_url(address, port), clients["h0"].session)
    done = await one_job(other, {"job_id": "v6-one", "argv": [sys.executable, "-c", REPORT]})
    line = (await other.log("v6-one")).decode().split()
    assert line[0] == "v6-one"
    assert line[-1] == f"http://[::1]:{ports['h2']}", "the job's SHOAL_DAEMON_URL, bracketed"
    assert done["job_id"] == "v6-one"

    gang = await one_job(
        clients["h1"],
        {"job_id": "v6-gang", "argv": [sys.executable, "-c", REPORT], "nodes": 3},
    )
    members = gang["gang"]["members"]
    assert sorted(m["node"] for m in members) == sorted(clients)
    assert [m["rank"] for m in members] == [0, 1, 2]
    for member in members:
        log = (await clients[member["node"]].log(member["job_id"])).decode().split()
        assert log[:3] == ["v6-gang", str(member["rank"]), "3"], log
        assert log[3] == "::1", "MASTER_ADDR is the rank-0 node's IPv6 address"
        assert log[4] == f"http://[::1]:{ports[member['node']]}"
