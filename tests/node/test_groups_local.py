"""Node-major groups: two nodes of two processes each form one gloo group of four, every
process asking its daemon for its own local rank's rendezvous (LOCAL_RANK)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from config import Role
from node.errors import RendezvousError
from node.plan import GroupSpec, RolePlan
from node.training.groups import (
    ElasticGroup,
    GroupError,
    _use_cuda_device,
    join_group,
    local_rank_from_env,
)
from node.training.rendezvous import DaemonEndpoint, Rendezvous, fetch_rendezvous, rendezvous_for
from tests.node.groups_fake_daemon import FakeDaemon, free_port

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).with_name("groups_local_worker.py"))


def two_by_two(port: int) -> RolePlan:
    return RolePlan(
        term=1,
        version=1,
        roles={"a": Role.TRAINING, "b": Role.TRAINING},
        training_ranks=("a", "b"),
        group=GroupSpec("127.0.0.1", port, 4, "gloo"),
        generation=0,
        local_world_sizes=(2, 2),
    )


def answers_of(plan: RolePlan, node_id: str) -> FakeDaemon:
    def answer(local_rank: int) -> Rendezvous | tuple[int, object]:
        try:
            found = rendezvous_for(plan, node_id, local_rank, owns_gpus=True)
        except RendezvousError as exc:
            return 400, {"error": "bad_request", "reason": str(exc), "status": 400}
        assert found is not None
        return found

    return FakeDaemon(answer)


def test_rendezvous_of_each_local_rank_is_node_major() -> None:
    plan = two_by_two(29500)
    got = {
        (node, local): rendezvous_for(plan, node, local, owns_gpus=True)
        for node in "ab"
        for local in range(2)
    }
    assert [(r.rank, r.node_rank, r.cuda_device) for r in got.values() if r] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 0),
        (3, 1, 1),
    ]
    assert all(r is not None and (r.nnodes, r.local_world_size) == (2, 2) for r in got.values())
    assert rendezvous_for(plan, "a", 1).cuda_device is None  # type: ignore[union-attr]
    with pytest.raises(RendezvousError, match="local_rank 2 is not one of this node's local"):
        rendezvous_for(plan, "b", 2)


def test_fetch_asks_for_the_local_rank_and_rank_zero_as_before() -> None:
    with answers_of(two_by_two(29500), "b") as daemon:
        endpoint = DaemonEndpoint(daemon.url)
        second = fetch_rendezvous(endpoint, local_rank=1)
        assert isinstance(second, Rendezvous)
        assert (second.rank, second.local_rank) == (3, 1)
        first = fetch_rendezvous(endpoint, local_rank=0)
        assert isinstance(first, Rendezvous)
        assert first.rank == 2
        assert daemon.paths == ["/v1/rendezvous?local_rank=1", "/v1/rendezvous"]
        with pytest.raises(RendezvousError, match="answered 400: local_rank 5 is not one"):
            fetch_rendezvous(endpoint, local_rank=5)
        with pytest.raises(RendezvousError, match="local_rank -1 must be an integer >= 0"):
            fetch_rendezvous(endpoint, local_rank=-1)


def test_local_rank_comes_from_the_environment() -> None:
    assert local_rank_from_env({}) == 0
    assert local_rank_from_env({"LOCAL_RANK": "3"}) == 3
    with pytest.raises(GroupError, match="LOCAL_RANK='x' is not an integer >= 0"):
        local_rank_from_env({"LOCAL_RANK": "x"})


def test_an_answer_for_another_local_rank_is_not_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = two_by_two(free_port())
    with FakeDaemon(lambda _: rendezvous_for(plan, "a", 0) or (409, {})) as daemon:
        group = ElasticGroup(DaemonEndpoint(daemon.url), local_rank=1, poll_interval_s=0.01)
        with pytest.raises(GroupError, match="answered local rank 0, not 1"):
            group.regroup(timeout_s=0.3)
        monkeypatch.setenv("LOCAL_RANK", "1")
        with pytest.raises(GroupError, match="answered local rank 0, not 1"):
            join_group(timeout_s=0.3, daemon_url=daemon.url)


def test_two_nodes_of_two_processes_form_one_group_of_four(tmp_path: Path) -> None:
    plan = two_by_two(free_port())
    daemons = {node: answers_of(plan, node) for node in "ab"}
    procs: list[subprocess.Popen[str]] = []
    try:
        for node, daemon in daemons.items():
            for local_rank in range(2):
                env = {
                    **os.environ,
                    "PYTHONPATH": str(ROOT),
                    "TORCH_CPP_LOG_LEVEL": "ERROR",
                    "LOCAL_RANK": str(local_rank),
                }
                with (tmp_path / f"{node}{local_rank}.err").open("w") as stderr:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, WORKER, daemon.url],
                            cwd=ROOT,
                            env=env,
                            stdout=subprocess.PIPE,
                            stderr=stderr,
                            text=True,
                        )
                    )
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
        errors = {p.name: p.read_text()[-2000:] for p in sorted(tmp_path.glob("*.err"))}
        assert [proc.returncode for proc in procs] == [0, 0, 0, 0], errors
        lines = [json.loads(out) for out in outputs]
        assert [(x["rank"], x["local_rank"], x["node_rank"]) for x in lines] == [
            (0, 0, 0),
            (1, 1, 0),
            (2, 0, 1),
            (3, 1, 1),
        ]
        assert all(x["world_size"] == 4 and x["local_world_size"] == 2 for x in lines)
        assert all(x["sum"] == 1 + 2 + 3 + 4 for x in lines)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for daemon in daemons.values():
            daemon.close()


class FakeCuda:
    """The torch.cuda calls _use_cuda_device makes, over `count` devices."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.current: int | None = None

    def device_count(self) -> int:
        return self.count

    def set_device(self, index: int) -> None:
        self.current = index


def test_nccl_uses_the_local_ranks_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(2)
    torch = SimpleNamespace(cuda=cuda, device=lambda kind, index: (kind, index))
    plan = two_by_two(29500)
    second = rendezvous_for(plan, "b", 1, owns_gpus=True)
    assert second is not None
    assert _use_cuda_device(torch, second) == ("cuda", 1)
    assert cuda.current == 1
    gpuless = rendezvous_for(plan, "b", 0)
    assert gpuless is not None
    assert _use_cuda_device(torch, gpuless) == ("cuda", 0)  # the local rank's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(GroupError, match=r"needs CUDA device 1 but this process sees 1 .*'3'"):
        _use_cuda_device(SimpleNamespace(cuda=FakeCuda(1), device=torch.device), second)
