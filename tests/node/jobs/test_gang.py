"""Gang jobs on a 3-node loopback cluster of real daemons (signed, elected): distinct ranks and
one MASTER_ADDR, a member's failure ends the gang, and member starts carry the plan fence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from config import NodeSettings
from node.daemon import NodeDaemon
from node.jobs import gang_master_port
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.jobs.helpers import JobClient, agreed, job_daemon, signed_session, write_secret

NAMES = ("n1", "n2", "n3")
REPORT = (
    "import os\n"
    "keys = ['SHOAL_JOB_ID', 'SHOAL_NODE_RANK', 'SHOAL_NODES_NUM', 'MASTER_ADDR', "
    "'MASTER_PORT', 'SHOAL_DAEMON_URL']\n"
    "print(' '.join(os.environ[k] for k in keys), flush=True)\n"
)
RANK_ONE_FAILS = (
    "import os, sys, time\n"
    "if os.environ['SHOAL_NODE_RANK'] == '1':\n"
    "    time.sleep(0.3); sys.exit(3)\n"
    "time.sleep(120)\n"
)


@dataclass
class Cluster:
    clients: dict[str, JobClient]
    settings: dict[str, NodeSettings]
    daemons: dict[str, NodeDaemon]
    stack: contextlib.AsyncExitStack

    async def restart(self, name: str) -> None:
        """Stop one daemon (its jobs keep running) and start it again on the same port."""
        await self.daemons[name].close()
        daemon = NodeDaemon(self.settings[name])
        self.daemons[name] = await self.stack.enter_async_context(daemon)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    secret = write_secret(tmp_path)
    ports = {name: free_port() for name in NAMES}
    common: dict[str, Any] = {
        **FAST_ELECTION,
        "voters": NAMES,
        "role": "training",
        "backend": "gloo",
        "secret_file": secret,
        "seeds": (f"127.0.0.1:{ports[NAMES[0]]}",),
    }
    settings = {name: test_settings(tmp_path, name, port=ports[name], **common) for name in NAMES}
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(signed_session())
        daemons = {}
        for name in NAMES:
            daemons[name] = await stack.enter_async_context(NodeDaemon(settings[name]))
        clients = {name: JobClient(f"http://127.0.0.1:{ports[name]}", session) for name in NAMES}
        await agreed(clients)
        try:
            yield Cluster(clients, settings, daemons, stack)
        finally:
            for client in clients.values():
                _, listing = await client.call("GET", "/v1/jobs?state=running")
                for job in listing["jobs"]:
                    await client.call(
                        "POST", f"/v1/jobs/{job['job_id']}/kill", json={"signal": "KILL"}
                    )
            for client in clients.values():
                _, listing = await client.call("GET", "/v1/jobs")
                for job in listing["jobs"]:
                    await client.wait(job["job_id"])


async def coordinator_and_other(clients: dict[str, JobClient]) -> tuple[str, str]:
    _, status = await clients["n1"].call("GET", "/v1/status")
    coordinator = status["coordinator"]
    return coordinator, next(n for n in NAMES if n != coordinator)


@pytest.mark.timeout(240)
async def test_gang_of_three_gets_ranks_one_master_and_ends_on_a_member_failure(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as running:
        clients = running.clients
        coordinator, receiver = await coordinator_and_other(clients)
        client = clients[receiver]
        spec = {"job_id": "g1", "name": "report", "argv": [sys.executable, "-c", REPORT]}
        status, gang = await client.call(
            "POST", "/v1/jobs", json={**spec, "nodes": 3, "role": "training"}
        )
        assert status == 201, gang
        assert gang["state"] == "running", gang
        done = await client.wait("g1")
        assert done["state"] == "succeeded", done
        members = done["gang"]["members"]
        _, audit = await client.call("GET", "/v1/audit?kind=job")
        starts = [(e["action"], e["subject"], e["sender"]) for e in audit["entries"]]
        assert ("gang start", "g1", "cli-tester") in starts, starts
        assert [m["rank"] for m in members] == [0, 1, 2]
        assert sorted(m["node"] for m in members) == sorted(NAMES)
        assert all(m["state"] == "succeeded" and m["exit_code"] == 0 for m in members)
        _, plan = await clients[coordinator].call("GET", "/v1/plan")
        ranks = plan["plan"]["training_ranks"]
        assert [m["node"] for m in members] == list(ranks), "the plan's ranks come first"
        lines = {}
        for member in members:
            member_client = clients[member["node"]]
            lines[member["rank"]] = (await member_client.log(member["job_id"])).decode().split()
        assert {line[1] for line in lines.values()} == {"0", "1", "2"}
        assert all(line[0] == "g1" and line[2] == "3" for line in lines.values())
        assert len({(line[3], line[4]) for line in lines.values()}) == 1, "one MASTER_ADDR:PORT"
        assert lines[0][3] == "127.0.0.1"
        for member in members:
            assert lines[member["rank"]][5] == clients[member["node"]].base

        status, again = await client.call(
            "POST", "/v1/jobs", json={**spec, "nodes": 3, "role": "training"}
        )
        assert status == 200
        assert again["job_id"] == "g1"

        failing = {"job_id": "g2", "argv": [sys.executable, "-c", RANK_ONE_FAILS], "nodes": 3}
        status, gang = await client.call("POST", "/v1/jobs", json=failing)
        assert status == 201, gang
        ended = await client.wait("g2", timeout_s=60)
        assert ended["state"] == "failed", ended
        assert ended["exit_code"] == 3
        assert "member rank 1" in ended["reason"]
        states = {m["rank"]: (m["state"], m["exit_code"]) for m in ended["gang"]["members"]}
        assert states[1] == ("failed", 3)
        assert states[0][0] == states[2][0] == "killed"


async def test_member_starts_need_the_current_plan_fence(tmp_path: Path) -> None:
    async with cluster(tmp_path) as running:
        clients = running.clients
        client = clients["n1"]
        _, status = await client.call("GET", "/v1/status")
        current = f"{status['term']}.{status['plan_version']}"
        gang = {"job_id": "x", "rank": 0, "nodes": 1, "master_addr": "127.0.0.1", "master_port": 1}
        body = {"job_id": "x.0", "argv": ["true"], "gang": gang}
        status_code, answer = await client.call(
            "POST", "/v1/jobs", json=body, headers={"X-Shoal-Fence": "0.1"}
        )
        assert (status_code, answer["error"]) == (409, "stale_fence"), answer
        status_code, answer = await client.call("POST", "/v1/jobs", json=body)
        assert (status_code, answer["error"]) == (409, "fence_refused"), answer
        status_code, answer = await client.call(
            "POST", "/v1/jobs", json=body, headers={"X-Shoal-Fence": current}
        )
        assert status_code == 201, answer


async def test_a_gang_larger_than_the_cluster_fails_with_the_reason(tmp_path: Path) -> None:
    async with cluster(tmp_path) as running:
        clients = running.clients
        status, gang = await clients["n2"].call(
            "POST", "/v1/jobs", json={"job_id": "big", "argv": ["true"], "nodes": 5}
        )
        assert status == 201
        assert gang["state"] == "failed"
        assert "5 any nodes was asked for, but 3" in gang["reason"]
        _, listing = await clients["n1"].call("GET", "/v1/jobs")
        assert listing["jobs"] == [], "all or nothing: no member started"


RENDEZVOUS_REPORT = (
    "import os\n"
    "keys = ['RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'LOCAL_RANK']\n"
    "print(' '.join(os.environ[k] for k in keys), flush=True)\n"
)


async def test_killing_a_gang_kills_every_member_and_env_from_rendezvous(tmp_path: Path) -> None:
    async with cluster(tmp_path) as running:
        clients = running.clients
        client = clients["n3"]
        body = {"job_id": "sleepers", "argv": ["sleep", "60"], "nodes": 3}
        status, gang = await client.call("POST", "/v1/jobs", json=body)
        assert status == 201, gang
        assert gang["state"] == "running"
        await client.kill("sleepers", signal="TERM", grace_s=2)
        ended = await client.wait("sleepers")
        assert ended["state"] == "killed", ended
        assert {m["state"] for m in ended["gang"]["members"]} == {"killed"}

        _, rendezvous = await client.call("GET", "/v1/rendezvous")
        job = await client.start(
            [sys.executable, "-c", RENDEZVOUS_REPORT], env_from="rendezvous", job_id="rdv"
        )
        await client.wait(job["job_id"])
        rank, world, addr, port, local = (await client.log("rdv")).decode().split()
        assert (int(rank), int(world)) == (rendezvous["rank"], 3)
        assert (addr, int(port), local) == (
            rendezvous["master_addr"],
            rendezvous["master_port"],
            "0",
        )
        status, refused = await client.call(
            "POST",
            "/v1/jobs",
            json={"argv": ["true"], "env_from": "rendezvous", "env": {"LOCAL_RANK": "5"}},
        )
        assert (status, refused["error"]) == (400, "bad_local_rank"), refused


async def test_env_from_rendezvous_without_a_training_rank_is_refused(tmp_path: Path) -> None:
    async with job_daemon(tmp_path, {**FAST_ELECTION, "role": "selfplay"}) as client:
        deadline = time.monotonic() + 30
        while (await client.call("GET", "/v1/status"))[1]["plan_version"] is None:
            assert time.monotonic() < deadline, "the lone node made no plan"
            await asyncio.sleep(0.05)
        status, body = await client.call(
            "POST", "/v1/jobs", json={"argv": ["true"], "env_from": "rendezvous"}
        )
        assert (status, body["error"]) == (409, "no_rendezvous"), body


async def test_a_gang_survives_a_restart_of_the_node_that_runs_it(tmp_path: Path) -> None:
    async with cluster(tmp_path) as running:
        client = running.clients["n3"]
        script = "import time; time.sleep(10)"
        body = {"job_id": "long", "argv": [sys.executable, "-c", script], "nodes": 3}
        status, gang = await client.call("POST", "/v1/jobs", json=body)
        assert status == 201, gang
        await running.restart("n3")
        _, again = await client.call("GET", "/v1/jobs/long")
        assert again["state"] == "running", again
        nodes = [m["node"] for m in gang["gang"]["members"]]
        assert [m["node"] for m in again["gang"]["members"]] == nodes
        ended = await client.wait("long", timeout_s=60)
        assert ended["state"] == "succeeded", ended
        assert [m["exit_code"] for m in ended["gang"]["members"]] == [0, 0, 0]


TORCHRUN_WORKER = """\
import datetime, json, os, sys
import torch
import torch.distributed as dist

if os.environ["WORLD_SIZE"] != "4":
    sys.exit(5)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT"]
line = {key: os.environ[key] for key in keys}
text = json.dumps({**line, "world": dist.get_world_size(), "sum": value.item()})
os.write(1, (text + "\\n").encode())  # one write: the workers share torchrun's stdout
dist.destroy_process_group()
"""
TORCHRUN_RECIPE = (
    'exec "$0" --nnodes "$NNODES" --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" '
    '--master-port "$MASTER_PORT" --nproc-per-node 2 "$1"'
)


def torchrun() -> str:
    """The torchrun that torch installed beside this interpreter."""
    found = Path(sys.executable).with_name("torchrun")
    assert found.exists(), f"torch installs torchrun at {found}"
    return str(found)


@pytest.mark.timeout(300)
async def test_a_gang_of_two_runs_torchrun_as_one_group_of_four(tmp_path: Path) -> None:
    """Two members each run the real torchrun with 2 workers from the gang's NNODES, NODE_RANK,
    MASTER_ADDR and MASTER_PORT: one world of 4 that all-reduces. The gang's first candidate
    port is taken on member 0's host, so the gang moves to the next one."""
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_WORKER)
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    candidates = [gang_master_port(29500, "tr", attempt) for attempt in range(3)]
    with contextlib.suppress(OSError):  # in use already: busy either way
        taken.bind(("127.0.0.1", candidates[0]))
        taken.listen(1)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(taken.close)
        running = await stack.enter_async_context(cluster(tmp_path))
        client = running.clients["n2"]
        argv = ["sh", "-c", TORCHRUN_RECIPE, torchrun(), str(script)]
        env = {"TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"}
        body = {"job_id": "tr", "argv": argv, "env": env, "nodes": 2}
        status, gang = await client.call("POST", "/v1/jobs", json=body)
        assert status == 201, gang
        done = await client.wait("tr", timeout_s=240)
        members = done["gang"]["members"]
        logs = {
            m["rank"]: (await running.clients[m["node"]].log(m["job_id"], "stdout")).decode()
            for m in members
        }
        errors = {
            m["rank"]: (await running.clients[m["node"]].log(m["job_id"], "stderr")).decode()
            for m in members
        }
        assert done["state"] == "succeeded", (done, logs, errors)
        port = done["gang"]["master_port"]
        assert port != candidates[0]
        assert port in candidates[1:]
        lines = [
            (member_rank, json.loads(text))
            for member_rank, log in logs.items()
            for text in log.splitlines()
            if text.startswith("{")
        ]
        assert sorted(int(line["RANK"]) for _, line in lines) == [0, 1, 2, 3]
        for member_rank, line in lines:
            assert line["GROUP_RANK"] == str(member_rank)
            assert int(line["RANK"]) // 2 == member_rank, "node-major ranks"
            assert (line["WORLD_SIZE"], line["LOCAL_WORLD_SIZE"]) == ("4", "2")
            assert line["LOCAL_RANK"] in ("0", "1")
            assert (line["world"], line["sum"]) == (4, 10.0)
