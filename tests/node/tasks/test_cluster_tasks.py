"""The `shoal` backend on a 3-node loopback cluster: tasks spread over workers on every node,
and the named-actor registry reached through daemons that are not the coordinator (they
forward to it): one actor for both, and ActorDiedError once its host is killed."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from node.tasks import ActorDiedError
from node.tasks.shoal import ShoalContext
from tests.node.jobs.client_daemon import ROOT
from tests.node.tasks.contract import InitCounting
from tests.node.workers.devcluster import NAMES, three_nodes
from tests.node.workers.test_cluster import client_config


def worker_pid(_: int) -> int:
    return os.getpid()


def scenario(urls: list[str], config: str, marker: str) -> dict[str, Any]:
    env = {"PYTHONPATH": str(ROOT)}
    first = ShoalContext(urls[0], config_file=config, workers_per_node=1, env=env)
    second = ShoalContext(urls[1], config_file=config, env=env, start_workers=False)
    try:
        pids = {first.get(f, timeout_s=60) for f in [first.run(worker_pid, i) for i in range(30)]}
        nodes = [n.node_id for n in first.cluster.nodes]
        one = first.create_actor(InitCounting, marker, name="shared", get_if_exists=True)
        two = second.create_actor(InitCounting, marker, name="shared", get_if_exists=True)
        calls = [first.get(one.incr.remote(), 60), second.get(two.incr.remote(), 60)]
        host = first.get(one.host_pid.remote(), timeout_s=60)
        record = first.registry("GET", "shared")
        os.kill(host, signal.SIGKILL)
        died = []
        for context, handle in ((first, one), (second, two)):
            try:
                context.get(handle.incr.remote(), timeout_s=30)
            except ActorDiedError as exc:
                died.append(str(exc))
        return {
            "pids": pids,
            "nodes": nodes,
            "handles": {
                (one.name, one.incarnation, one.address),
                (two.name, two.incarnation, two.address),
            },
            "calls": calls,
            "record": record,
            "died": died,
        }
    finally:
        first.close()
        second.close()


@pytest.mark.timeout(300)
async def test_tasks_spread_and_actors_through_forwarding_daemons(tmp_path: Path) -> None:
    config = str(client_config(tmp_path))
    marker = tmp_path / "instances"
    async with three_nodes(tmp_path) as clients:
        _, status = await clients["n1"].call("GET", "/v1/status")
        others = [n for n in NAMES if n != status["coordinator"]]
        urls = [clients[n].base for n in others]
        result = await asyncio.to_thread(scenario, urls, config, str(marker))
        _, on_coordinator = await clients[status["coordinator"]].call("GET", "/v1/actors/shared")
    assert sorted(result["nodes"]) == list(NAMES)
    assert len(result["pids"]) == 3  # one worker on each of the three nodes ran tasks
    assert len(result["handles"]) == 1
    assert result["calls"] == [1, 2]
    assert len(marker.read_text().split()) == 1
    assert result["record"]["incarnation"] == 1
    assert on_coordinator["incarnation"] == 1
    assert on_coordinator["state"] == "dead"  # the first caller to see the loss reported it
    assert len(result["died"]) == 2
