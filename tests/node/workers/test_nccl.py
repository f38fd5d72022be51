"""NCCL settings: ranks in node order, the environment, and the nodes of a plan."""

from __future__ import annotations

import pytest

from node.workers import (
    NCCLConfig,
    WorkerError,
    create_nccl_configs,
    load_work_fn,
    nodes_of_plan,
    setup_nccl_env,
)
from tests.node.workers import fns


def test_ranks_in_node_order_and_local_ranks_per_node() -> None:
    configs = create_nccl_configs("10.0.0.1", [2, 1, 3], master_port=29400)
    assert [c.rank for c in configs] == list(range(6))
    assert [c.local_rank for c in configs] == [0, 1, 0, 0, 1, 2]
    assert {c.world_size for c in configs} == {6}
    assert {(c.master_addr, c.master_port) for c in configs} == {("10.0.0.1", 29400)}
    assert NCCLConfig.from_message(configs[4].to_message()) == configs[4]
    named = create_nccl_configs("10.0.0.1", [("node1", 2), ("node2", 1), ("node3", 3)], 29400)
    assert named == configs
    assert NCCLConfig(**configs[2].__dict__) == configs[2]  # miniray's NCCLConfig(**recv())
    with pytest.raises(ValueError, match="at least one"):
        create_nccl_configs("10.0.0.1", [1, 0])


def test_setup_nccl_env() -> None:
    env: dict[str, str] = {}
    setup_nccl_env(NCCLConfig("10.0.0.1", 29500, 4, 3, 1), env)
    assert env == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "4",
        "RANK": "3",
        "LOCAL_RANK": "1",
    }


def test_nodes_of_plan_follow_training_ranks() -> None:
    announce = {
        "plan": {
            "roles": {"a": "training", "b": "inference", "c": "training"},
            "training_ranks": ["c", "a"],
            "rendezvous": {"master_addr": "10.0.0.3", "master_port": 29501},
        }
    }
    members = [
        {"node_id": n, "address": f"10.0.0.{i}", "port": 8770, "state": "alive"}
        for i, n in enumerate("abc", start=1)
    ]
    nodes, addr, port = nodes_of_plan(announce, members, "training", 2)
    assert [n.node_id for n in nodes] == ["c", "a"]
    assert [n.url for n in nodes] == ["http://10.0.0.3:8770", "http://10.0.0.1:8770"]
    assert (addr, port) == ("10.0.0.3", 29501)
    inference, _, _ = nodes_of_plan(announce, members, "inference", 1)
    assert [n.node_id for n in inference] == ["b"]
    assert [n.node_id for n in nodes_of_plan(announce, members, "any", 1)[0]] == ["a", "b", "c"]
    members[0]["meta"] = {"gpu_count": 8}
    members[1]["meta"] = {"gpu_count": 2}
    members[2]["meta"] = {"gpu_count": 4}
    with_gpus = nodes_of_plan(announce, members, "any", 1, gpus=3)[0]
    assert [n.node_id for n in with_gpus] == ["a", "c"]  # most GPUs first
    assert [n.node_id for n in nodes_of_plan(announce, members, "training", 1, 6)[0]] == ["a"]
    with pytest.raises(WorkerError, match="no node with 9 GPUs"):
        nodes_of_plan(announce, members, "any", 1, gpus=9)
    members[0]["state"] = "dead"
    with pytest.raises(WorkerError, match="not an alive member"):
        nodes_of_plan(announce, members, "training", 1)
    with pytest.raises(WorkerError, match="no role plan"):
        nodes_of_plan({"plan": None}, members, "training", 1)


def test_work_fn_specs() -> None:
    assert load_work_fn("tests.node.workers.fns:echo") is fns.echo
    assert load_work_fn("tests.node.workers.fns.echo") is fns.echo
    with pytest.raises(WorkerError, match="no function nope"):
        load_work_fn("tests.node.workers.fns:nope")
    with pytest.raises(WorkerError, match="cannot import"):
        load_work_fn("no_such_module_here:main")
