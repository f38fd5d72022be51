"""`Cluster.from_plan` on a 3-node loopback cluster of real daemons: a worker server started
through the job API on every training node, distinct NCCL ranks in the plan's rank order, and
`stop()` leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from node.workers import Cluster, NCCLConfig
from tests.node.jobs.client_daemon import ROOT
from tests.node.jobs.helpers import process_group_members
from tests.node.workers.devcluster import three_nodes
from tests.node.workers.test_remote import alive


def pgid_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[2])


def client_config(tmp_path: Path) -> Path:
    """The config file the Python job client reads: the cluster secret of the test daemons."""
    path = tmp_path / "client.yaml"
    path.write_text(json.dumps({"secret_file": str(tmp_path / "secret"), "mdns": False}))
    return path


def start_and_report(url: str, config: str) -> tuple[Cluster, list[dict[str, object]]]:
    workers_cluster = Cluster.from_plan(url, "training", num_workers=2, config_file=config)
    workers = workers_cluster.start(
        "tests.node.workers.fns:rank_report", env={"PYTHONPATH": str(ROOT)}
    )
    replies = []
    for worker, config_of in zip(workers, workers_cluster.nccl_configs, strict=True):
        worker.send(config_of.to_message())
        replies.append(worker.recv(timeout_s=60))
    return workers_cluster, replies


@pytest.mark.timeout(240)
async def test_from_plan_starts_workers_through_jobs_with_distinct_ranks(tmp_path: Path) -> None:
    config = str(client_config(tmp_path))
    async with three_nodes(tmp_path) as clients:
        url = clients["n2"].base
        workers_cluster, replies = await asyncio.to_thread(start_and_report, url, config)
        try:
            _, plan = await clients["n1"].call("GET", "/v1/plan")
            ranked = plan["plan"]["training_ranks"]
            assert [n.node_id for n in workers_cluster.nodes] == ranked
            assert len(ranked) == 3
            ranks = [int(r["env"]["RANK"]) for r in replies]
            assert ranks == list(range(6))
            assert {r["env"]["WORLD_SIZE"] for r in replies} == {"6"}
            assert [int(r["env"]["LOCAL_RANK"]) for r in replies] == [0, 1] * 3
            rendezvous = plan["plan"]["group"]
            assert {r["env"]["MASTER_ADDR"] for r in replies} == {rendezvous["master_addr"]}
            assert all(isinstance(c, NCCLConfig) for c in workers_cluster.nccl_configs)
            pids = [int(str(r["pid"])) for r in replies]
            assert len(set(pids)) == 6
            jobs = []
            for node, state in zip(workers_cluster.nodes, workers_cluster.job_states, strict=True):
                client = next(c for c in clients.values() if c.base == node.url)
                _, record = await client.call("GET", f"/v1/jobs/{state['job_id']}")
                assert record["state"] == "running"
                jobs.append(record)
            groups = {int(r["pid"]) for r in jobs}
            assert {pgid_of(pid) for pid in pids} <= groups  # workers run in their server's job
            assert os.getpid() not in pids
        finally:
            await asyncio.to_thread(workers_cluster.stop)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not [pid for pid in pids if alive(pid)]
        for record in jobs:
            assert not alive(int(record["pid"]))
            assert process_group_members(int(record["pid"])) == []
