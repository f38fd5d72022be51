"""torchrun's worker environment from a rendezvous: every variable with its exact value, the
defaults torchrun applies, and the variables of `env_from: rendezvous` jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config import Timeouts
from node.errors import JobError, LauncherError
from node.jobs.policy import rendezvous_env
from node.training.rendezvous import Rendezvous
from node.training.torchrun import (
    TORCHRUN_VARIABLES,
    NodePlace,
    node_place,
    torchrun_env,
    training_base_env,
    training_env,
)


def rdv(**changes: Any) -> Rendezvous:
    fields: dict[str, Any] = {
        "rank": 2,
        "world_size": 3,
        "master_addr": "10.0.0.1",
        "master_port": 29505,
        "backend": "gloo",
        "generation": 5,
        "term": 2,
        "plan_version": 9,
    }
    return Rendezvous(**(fields | changes))


def test_every_torchrun_variable_of_a_one_worker_node() -> None:
    env = torchrun_env(rdv(), restart_count=3, max_restarts=4)
    assert env == {
        "RANK": "2",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "3",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "2",
        "GROUP_WORLD_SIZE": "3",
        "ROLE_RANK": "2",
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": "3",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29505",
        "TORCHELASTIC_RESTART_COUNT": "3",
        "TORCHELASTIC_MAX_RESTARTS": "4",
        "TORCHELASTIC_RUN_ID": "shoal-gen5",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "SHOAL_GENERATION": "5",
        "SHOAL_BACKEND": "gloo",
    }
    assert set(env) == set(TORCHRUN_VARIABLES)


def test_inherited_nccl_error_handling_is_kept_and_the_base_is_kept_under_the_variables() -> None:
    base = {"PATH": "/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "RANK": "stale"}
    env = training_env(rdv(), base)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert env["PATH"] == "/bin"
    assert env["RANK"] == "2"
    assert "OMP_NUM_THREADS" not in env, "one worker: torchrun leaves OMP_NUM_THREADS alone"


def test_no_rank_and_a_local_rank_beyond_the_node_are_refused() -> None:
    with pytest.raises(LauncherError, match="generation 5 gives this node no rank"):
        torchrun_env(rdv(rank=None))
    with pytest.raises(LauncherError, match="local rank 1 is not below this node's local world"):
        torchrun_env(rdv(), local_rank=1)


def test_a_job_gets_the_torchrun_variables_for_local_rank_0_or_its_own() -> None:
    document = rdv().to_dict()
    env = rendezvous_env(document, {"PATH": "/bin"})
    assert env == torchrun_env(rdv())
    assert "PATH" not in env
    assert rendezvous_env(document, {"LOCAL_RANK": "0"})["LOCAL_RANK"] == "0"
    kept = rendezvous_env(document, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert kept["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


@pytest.mark.parametrize("local_rank", ["1", "-1", "x", "²"])
def test_a_job_with_a_local_rank_this_node_lacks_is_refused(local_rank: str) -> None:
    with pytest.raises(JobError) as refused:
        rendezvous_env(rdv().to_dict(), {"LOCAL_RANK": local_rank})
    assert (refused.value.status, refused.value.code) == (400, "bad_local_rank")
    assert f"LOCAL_RANK {local_rank!r} is not a local rank of this node (0 to 0)" in str(
        refused.value.reason
    )


def test_a_job_on_a_node_without_a_rank_gets_nothing() -> None:
    assert rendezvous_env(None) == {}
    assert rendezvous_env(rdv(rank=None).to_dict()) == {}


def node_1_of_2(local_rank: int = 0, **changes: Any) -> Rendezvous:
    """Local rank `local_rank` of node 1 of 2, each with 2 local ranks (world 4)."""
    fields: dict[str, Any] = {
        "rank": 2 + local_rank,
        "world_size": 4,
        "local_rank": local_rank,
        "local_world_size": 2,
        "node_rank": 1,
        "nnodes": 2,
    }
    return rdv(**(fields | changes))


@pytest.mark.parametrize("answered_for", [0, 1])
def test_every_torchrun_variable_of_local_rank_1_of_a_two_worker_node(answered_for: int) -> None:
    env = torchrun_env(node_1_of_2(answered_for), local_rank=1, restart_count=1, max_restarts=2)
    assert env == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "3",
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29505",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "2",
        "TORCHELASTIC_RUN_ID": "shoal-gen5",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
        "SHOAL_GENERATION": "5",
        "SHOAL_BACKEND": "gloo",
    }
    assert torchrun_env(node_1_of_2(answered_for))["RANK"] == "2"


def test_the_node_place_of_a_rendezvous() -> None:
    assert node_place(node_1_of_2(1)) == NodePlace(2, 2, 1, 2)
    assert node_place(rdv()) == NodePlace(2, 1, 2, 3), "an older daemon's answer: one per node"
    with pytest.raises(LauncherError, match="lacks node_rank"):
        node_place(node_1_of_2(node_rank=None))
    with pytest.raises(LauncherError, match="local rank 2 is not below"):
        node_place(node_1_of_2()).rank_of(2)


def test_an_inherited_omp_num_threads_is_left_alone() -> None:
    env = training_env(node_1_of_2(), {"OMP_NUM_THREADS": "8"}, local_rank=1)
    assert env["OMP_NUM_THREADS"] == "8"


def test_a_job_with_its_own_local_rank_gets_that_ranks_variables() -> None:
    env = rendezvous_env(node_1_of_2().to_dict(), {"LOCAL_RANK": "1"})
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) == ("3", "1", "1")
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
    with pytest.raises(JobError, match=r"LOCAL_RANK '2' is not a local rank of this node \(0 to 1"):
        rendezvous_env(node_1_of_2().to_dict(), {"LOCAL_RANK": "2"})


def test_the_workers_base_env_layers_gpus_under_the_setting_and_the_daemon_url_over_all() -> None:
    inherited = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "X": "daemon"}
    gpus = {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    setting = {"X": "setting", "SHOAL_DAEMON_URL": "http://elsewhere"}
    env = training_base_env(inherited, setting, "http://10.0.0.2:8770", gpus)
    assert env == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "1,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "X": "setting",
        "SHOAL_DAEMON_URL": "http://10.0.0.2:8770",
        "SHOAL_REFORM": "restart",
    }
    own = training_base_env(inherited, {"CUDA_VISIBLE_DEVICES": "3"}, "http://d", gpus)
    assert own["CUDA_VISIBLE_DEVICES"] == "3", "the operator's training_env wins"
    assert training_base_env(inherited, {}, "http://d", {})["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_the_workers_base_env_carries_the_nodes_group_timeouts() -> None:
    timeouts = Timeouts(collective_s=25, quorum_s=90)
    env = training_base_env({}, {"SHOAL_QUORUM_S": "30"}, "http://d", {}, timeouts)
    assert (env["SHOAL_COLLECTIVE_S"], env["SHOAL_QUORUM_S"]) == ("25", "30")


def test_the_workers_base_env_names_the_nodes_checkpoint_directory_over_the_setting() -> None:
    setting = {"SHOAL_CHECKPOINT_DIR": "/elsewhere"}
    env = training_base_env({}, setting, "http://d", {}, checkpoint_dir=Path("/data/checkpoints"))
    assert env["SHOAL_CHECKPOINT_DIR"] == "/data/checkpoints"
    assert "SHOAL_CHECKPOINT_DIR" not in training_base_env({}, {}, "http://d", {})


def test_the_workers_base_env_names_the_nodes_training_reform_over_the_setting() -> None:
    setting = {"SHOAL_REFORM": "restart"}
    env = training_base_env({}, setting, "http://d", {}, reform="in_place")
    assert env["SHOAL_REFORM"] == "in_place"
