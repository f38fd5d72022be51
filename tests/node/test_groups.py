"""Elastic groups: the rendezvous JSON, the daemon client, backend choice, store prefixes,
changed() rate limiting, and joins of a one-rank gloo group in this process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from config import Role, Timeouts
from node.plan import GroupSpec, RolePlan
from node.training.groups import ElasticGroup, choose_backend
from node.training.rendezvous import (
    DaemonEndpoint,
    GroupError,
    MasterUnreachable,
    NoRank,
    Rendezvous,
    RendezvousError,
    daemon_endpoint,
    fetch_rendezvous,
    rendezvous_for,
    store_prefix,
)
from tests.node.groups_fake_daemon import FakeDaemon, free_port

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"0123456789abcdef0123456789abcdef"
TIMEOUTS = Timeouts(collective_s=5.0, quorum_s=10.0)


def rdv(generation: int = 4, rank: int | None = 0, **changes: Any) -> Rendezvous:
    fields: dict[str, Any] = {
        "rank": rank,
        "world_size": 1,
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "backend": "gloo",
        "generation": generation,
        "term": 3,
        "plan_version": 8,
    }
    return Rendezvous(**(fields | changes))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def daemon() -> Iterator[FakeDaemon]:
    with FakeDaemon(rdv()) as fake:
        yield fake


def endpoint_of(daemon: FakeDaemon, secret: bytes | None = None) -> DaemonEndpoint:
    return DaemonEndpoint(daemon.url, secret=secret, timeout_s=2.0)


def torch_module() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
        import torch
        import torch.distributed

    return torch


def dist() -> Any:
    return torch_module().distributed


def test_rendezvous_json_round_trip_has_the_contract_fields() -> None:
    data = rdv(rank=None, world_size=3).to_dict()
    assert data == {
        "rank": None,
        "world_size": 3,
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "backend": "gloo",
        "generation": 4,
        "term": 3,
        "plan_version": 8,
        "local_rank": 0,
        "local_world_size": 1,
        "node_rank": None,
        "nnodes": 0,
        "cuda_device": None,
    }
    assert Rendezvous.from_dict(json.loads(json.dumps(data))) == rdv(rank=None, world_size=3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rank": 3, "world_size": 3}, "rank 3 is not below 3"),
        ({"rank": True}, "rank True"),
        ({"world_size": "2"}, "world_size must be an integer"),
        ({"generation": -1}, "generation must be an integer >= 0"),
        ({"backend": "mpi"}, "backend 'mpi'"),
        ({"master_port": 70000}, "master_port 70000"),
        ({"master_addr": ""}, "needs master_addr and master_port"),
        ({"master_addr": 5}, "master_addr 5"),
    ],
)
def test_rendezvous_refuses_bad_fields(change: dict[str, Any], message: str) -> None:
    with pytest.raises(RendezvousError, match=message):
        Rendezvous.from_dict(rdv().to_dict() | change)


def test_rendezvous_from_dict_names_missing_fields_and_non_objects() -> None:
    data = rdv().to_dict()
    del data["term"], data["master_port"]
    with pytest.raises(RendezvousError, match="lacks master_port, term"):
        Rendezvous.from_dict(data)
    with pytest.raises(RendezvousError, match="must be a JSON object, not list"):
        Rendezvous.from_dict([1, 2])


def test_same_group_ignores_term_and_plan_version_only() -> None:
    assert rdv().same_group(rdv(term=9, plan_version=99))
    assert not rdv().same_group(rdv(generation=5))
    assert not rdv().same_group(rdv(master_port=29501))
    assert not rdv().same_group(None)


@pytest.mark.parametrize(
    ("requested", "cuda", "expected"),
    [
        ("nccl", True, "nccl"),
        ("nccl", False, "gloo"),
        ("gloo", True, "gloo"),
        ("gloo", False, "gloo"),
    ],
)
def test_backend_is_nccl_only_with_cuda(requested: Any, cuda: bool, expected: str) -> None:
    assert choose_backend(requested, cuda) == expected


def test_store_prefix_names_the_generation() -> None:
    assert store_prefix(12) == "shoal/gen12"
    assert rdv(generation=3).store_prefix == "shoal/gen3"


def test_fetch_answers_rendezvous_or_no_rank(daemon: FakeDaemon) -> None:
    assert fetch_rendezvous(endpoint_of(daemon)) == rdv()
    daemon.answer = (409, {"error": "this node runs selfplay", "status": 409})
    assert fetch_rendezvous(endpoint_of(daemon)) == NoRank(409, "this node runs selfplay")
    daemon.answer = (404, {"reason": "no plan yet"})
    assert fetch_rendezvous(endpoint_of(daemon)) == NoRank(404, "no plan yet")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"{not json", "answered invalid JSON: b'{not json'"),
        (b'{"rank": 0}', "answered a bad rendezvous: rendezvous lacks world_size"),
        ((500, {"error": "boom"}), "answered 500: boom"),
    ],
)
def test_fetch_names_the_daemon_on_a_bad_answer(
    daemon: FakeDaemon, answer: Any, message: str
) -> None:
    daemon.answer = answer
    with pytest.raises(RendezvousError, match=f"{daemon.url}/v1/rendezvous {message}"):
        fetch_rendezvous(endpoint_of(daemon))


def test_fetch_from_a_daemon_that_is_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RendezvousError, match=f"daemon at {url}/v1/rendezvous is unreachable"):
        fetch_rendezvous(DaemonEndpoint(url, timeout_s=1.0))


def test_fetch_signs_when_given_the_secret() -> None:
    with FakeDaemon(rdv(), secret=SECRET) as daemon:
        assert fetch_rendezvous(endpoint_of(daemon, SECRET)) == rdv()
        with pytest.raises(RendezvousError, match="answered 401: missing signature headers"):
            fetch_rendezvous(endpoint_of(daemon))


def test_daemon_endpoint_from_arguments_and_environment(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    secret_file.chmod(0o600)
    env = {"SHOAL_P2P_PORT": "9001", "SHOAL_SECRET_FILE": str(secret_file), "SHOAL_NODE_ID": "n1"}
    endpoint = daemon_endpoint(env=env, timeouts=TIMEOUTS)
    assert endpoint == DaemonEndpoint("http://127.0.0.1:9001", SECRET, "n1", 10.0)
    env["SHOAL_DAEMON_URL"] = "http://127.0.0.2:8000/"
    assert daemon_endpoint(env=env).url == "http://127.0.0.2:8000"
    assert daemon_endpoint("http://127.0.0.1:1", env={}).url == "http://127.0.0.1:1"
    assert daemon_endpoint(env={}).url == "http://127.0.0.1:8770"
    with pytest.raises(RendezvousError, match="must start with http"):
        daemon_endpoint("file:///etc/passwd", env={})


def test_importing_node_needs_no_torch() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import node, node.training.groups, node.training.launcher\n"
        "from node.training.groups import GroupError, _torch\n"
        "try:\n"
        "    _torch()\n"
        "except GroupError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "torch is not installed" in result.stdout


def test_one_rank_group_prefixes_keys_and_changed_is_rate_limited(daemon: FakeDaemon) -> None:
    port = free_port()
    daemon.answer = rdv(generation=4, master_port=port)
    clock = FakeClock()
    group = ElasticGroup(endpoint_of(daemon), TIMEOUTS, changed_interval_s=1.0, clock=clock)
    with group:
        group.regroup(timeout_s=10)
        assert (group.generation, group.rank, group.world_size) == (4, 0, 1)
        assert dist().get_backend() == "gloo"
        group.store.set("weights", b"v4")
        raw = dist().TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
        assert raw.get("shoal/gen4/weights") == b"v4"
        del raw

        requests = daemon.requests
        assert not group.changed()
        clock.now += 0.9
        assert not group.changed()
        assert daemon.requests == requests
        clock.now += 0.2
        assert not group.changed()
        assert daemon.requests == requests + 1

        new_port = free_port()
        daemon.answer = rdv(generation=5, master_port=new_port)
        assert not group.changed()
        clock.now += 1.0
        assert group.changed()
        assert group.changed()
        assert daemon.requests == requests + 2

        group.regroup(timeout_s=10)
        assert (group.generation, dist().is_initialized()) == (5, True)
        group.store.set("weights", b"v5")
        raw = dist().TCPStore("127.0.0.1", new_port, is_master=False, timeout=timedelta(seconds=5))
        assert raw.get("shoal/gen5/weights") == b"v5"
        assert not raw.check(["shoal/gen4/weights"])
        del raw
    assert not dist().is_initialized()
    with pytest.raises(GroupError, match="closed"):
        group.regroup(timeout_s=1)


def test_changed_when_rank_is_gone_and_not_when_the_daemon_fails(
    daemon: FakeDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    daemon.answer = rdv(master_port=free_port())
    clock = FakeClock()
    with ElasticGroup(endpoint_of(daemon), TIMEOUTS, clock=clock) as group:
        group.regroup(timeout_s=10)
        daemon.answer = (500, {"error": "restarting"})
        clock.now += 5
        with caplog.at_level(logging.WARNING, logger="node.training.groups"):
            assert not group.changed()
        assert "generation 4: cannot check the rendezvous" in caplog.text
        daemon.answer = (409, {"error": "this node runs selfplay"})
        clock.now += 5
        assert group.changed()


def test_nccl_rendezvous_without_cuda_forms_a_gloo_group(
    daemon: FakeDaemon, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a host where CUDA is unavailable (made so here, whatever this host has)."""
    monkeypatch.setattr(torch_module().cuda, "is_available", lambda: False)
    daemon.answer = rdv(backend="nccl", master_port=free_port())
    with (
        caplog.at_level(logging.WARNING, logger="node.training.groups"),
        ElasticGroup(endpoint_of(daemon), TIMEOUTS) as group,
    ):
        group.regroup(timeout_s=10)
        assert dist().get_backend() == "gloo"
    assert "CUDA is unavailable; using gloo, not nccl" in caplog.text


@pytest.mark.gpu
def test_nccl_rendezvous_with_cuda_forms_an_nccl_group(
    daemon: FakeDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    """On a host with CUDA: a one-rank NCCL group that all-reduces a CUDA tensor."""
    torch = torch_module()
    daemon.answer = rdv(backend="nccl", master_port=free_port())
    with (
        caplog.at_level(logging.WARNING, logger="node.training.groups"),
        ElasticGroup(endpoint_of(daemon), TIMEOUTS) as group,
    ):
        group.regroup(timeout_s=10)
        assert dist().get_backend() == "nccl"
        tensor = torch.ones(4, device="cuda")
        dist().all_reduce(tensor)
        assert tensor.tolist() == [1.0] * 4
    assert "CUDA is unavailable" not in caplog.text


def test_regroup_waits_for_a_new_generation(daemon: FakeDaemon) -> None:
    daemon.answer = rdv(master_port=free_port())
    with ElasticGroup(endpoint_of(daemon), TIMEOUTS, poll_interval_s=0.05) as group:
        group.regroup(timeout_s=10)
        with pytest.raises(GroupError, match="showed no generation but 4 with a rank"):
            group.regroup(timeout_s=0.3)
        assert not dist().is_initialized()


def test_join_without_a_rank_times_out_with_the_daemons_reason(daemon: FakeDaemon) -> None:
    daemon.answer = (409, {"error": "this node runs selfplay"})
    group = ElasticGroup(endpoint_of(daemon), TIMEOUTS, poll_interval_s=0.05)
    with pytest.raises(GroupError, match="409: this node runs selfplay"):
        group.regroup(timeout_s=0.3)
    daemon.answer = b"<html>"
    with pytest.raises(GroupError, match="invalid JSON"):
        group.regroup(timeout_s=0.3)


def test_unreachable_master_names_address_and_generation(daemon: FakeDaemon) -> None:
    port = free_port()
    daemon.answer = rdv(generation=7, rank=1, world_size=2, master_port=port)
    with ElasticGroup(endpoint_of(daemon), TIMEOUTS) as group:
        with pytest.raises(
            MasterUnreachable, match=f"generation 7: master 127.0.0.1:{port} unreachable for"
        ):
            group.regroup(timeout_s=1.0)
        assert not dist().is_initialized()


def test_rank_zero_names_the_ranks_that_never_joined(daemon: FakeDaemon) -> None:
    port = free_port()
    daemon.answer = rdv(generation=9, rank=0, world_size=2, master_port=port)
    with ElasticGroup(endpoint_of(daemon), TIMEOUTS) as group:
        with pytest.raises(GroupError, match=f"generation 9: rank 0 could not host .* port {port}"):
            group.regroup(timeout_s=1.0)
        assert not dist().is_initialized()


def test_gloo_interface_binding_is_scoped_and_yields_to_the_operator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from node.training import groups

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with groups.gloo_bound_to_route("127.0.0.1"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    with groups.gloo_bound_to_route("127.0.0.1"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"


def test_rendezvous_for_a_plan_moves_the_port_with_the_generation() -> None:
    plan = RolePlan(
        term=4,
        version=9,
        roles={"a": Role.TRAINING, "b": Role.TRAINING, "c": Role.SELFPLAY},
        training_ranks=("b", "a"),
        group=GroupSpec("10.0.0.2", 29500, 2, "gloo"),
        generation=1007,
    )
    assert rendezvous_for(plan, "a") == Rendezvous(
        rank=1,
        world_size=2,
        master_addr="10.0.0.2",
        master_port=29507,
        backend="gloo",
        generation=1007,
        term=4,
        plan_version=9,
        local_rank=0,
        local_world_size=1,
        node_rank=1,
        nnodes=2,
    )
    assert rendezvous_for(plan, "b").rank == 0  # type: ignore[union-attr]
    selfplay = rendezvous_for(plan, "c")
    assert selfplay is not None
    assert selfplay.rank is None
    assert selfplay.generation == 1007
    assert rendezvous_for(None, "a") is None
    nobody = RolePlan(4, 10, {"c": Role.SELFPLAY}, (), GroupSpec("", 29500, 0, "gloo"))
    assert rendezvous_for(nobody, "c") == Rendezvous(
        None, 0, "", 29500, "gloo", 0, 4, 10, local_world_size=0
    )
