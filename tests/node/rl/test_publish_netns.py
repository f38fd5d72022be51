"""The kill/stop test of test_publish.py across network namespaces: the trainer, and the weights
plane and a receiver process of each of two generator hosts, on three netns hosts. Every round a
receiver is SIGKILLed or SIGSTOPped mid-broadcast: the trainer's publish returns within
deadline + 1 s naming it, the survivor keeps receiving, and the faulty one catches up from the
weights file. No GLOO_SOCKET_IFNAME is set: the weights group finds the interface itself."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from node.errors import PublishTimeout
from node.rl.publisher import PublishResult, WeightPublisher
from tests.cluster import NetnsClusterFactory
from tests.cluster.process import ClusterProcess
from tests.cluster.sshd import run_in_namespace

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.netns

PLANE = Path(__file__).with_name("weights_plane.py")
CHILD = Path(__file__).with_name("receiver_child.py")
DEADLINE_S = 2.0
ROUNDS = int(os.environ.get("SHOAL_RL_NETNS_FAULT_ROUNDS", "20"))
RUN = "r1"
NODES = ("t", "a", "b")
LIVENESS_S = 60.0
T = TypeVar("T")


def model_at(step: int) -> torch.nn.Module:
    torch.manual_seed(7)  # the receivers' model (receiver_child.make_model) at step 0
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    with torch.no_grad():
        for param in net.parameters():
            param.add_(0.01 * step)
    return net


def until(check: Callable[[], bool], what: str, timeout_s: float = LIVENESS_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_dead_or_stalled_receiver_on_another_host_cannot_hang_the_trainer(
    netns_cluster: NetnsClusterFactory, tmp_path: Path, fault: str
) -> None:
    cluster = netns_cluster(3)
    hosts = dict(zip(NODES, cluster.hosts, strict=True))
    addresses = {node: host.address for node, host in hosts.items()}
    port = hosts["t"].port
    urls = {node: f"http://{address}:{port}" for node, address in addresses.items()}
    models_dir = tmp_path / "models"  # one file system: the file fan-out is not under test
    planes = {
        node: host.spawn(
            [sys.executable, str(PLANE), node, str(port), json.dumps(addresses)], name="plane"
        )
        for node, host in hosts.items()
    }
    for node, plane in planes.items():
        until(lambda p=plane: "serving" in p.log_text(), f"the weights plane of {node}")
    receivers: dict[str, ClusterProcess] = {}

    def start_receiver(node: str, plan: str = "none") -> None:
        argv = [sys.executable, str(CHILD), urls[node], RUN, str(models_dir), plan]
        receivers[node] = hosts[node].spawn(argv, name=f"receiver-{plan.replace(':', '-')}")
        until(lambda: '"started"' in receivers[node].log_text(), f"the receiver on {node}")

    def on_trainer(fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return run_in_namespace(hosts["t"].ns, call, timeout_s=LIVENESS_S)

    def status(node: str) -> dict[str, Any] | None:
        def get() -> dict[str, Any] | None:
            url = f"{urls[node]}/v1/weights/status?run={RUN}"
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    found: dict[str, Any] = json.loads(answer.read())
                    return found
            except urllib.error.HTTPError:
                return None

        return on_trainer(get)

    publisher = WeightPublisher(
        RUN, urls["t"], models_dir=models_dir, deadline_s=DEADLINE_S, join_s=1.0
    )

    def publish(version: int) -> tuple[PublishResult | Exception, float]:
        def run() -> tuple[PublishResult | Exception, float]:
            started = time.monotonic()
            try:
                result: PublishResult | Exception = publisher.publish(model_at(version), version)
            except PublishTimeout as exc:
                result = exc
            return result, time.monotonic() - started

        return on_trainer(run)

    def survivor_has(version: int) -> None:
        applied = status("a")
        assert applied is not None
        assert applied["version"] == version
        assert applied["source"] == "broadcast"

    version = 1
    start_receiver("a")
    start_receiver("b", f"{fault}:2")
    try:
        result, took = publish(version)
        assert isinstance(result, PublishResult), result
        assert result.acknowledged == ("a", "b")
        assert status("b")["digest"] == result.digest.to_dict()  # type: ignore[index]
        for _ in range(ROUNDS):
            version += 1
            result, took = publish(version)
            assert took <= DEADLINE_S + 1.0, took
            assert isinstance(result, PublishTimeout), result
            assert "b" in result.receivers  # (the survivor may miss this version with it)
            assert "b" in str(result)
            version += 1
            result, took = publish(version)
            assert took <= DEADLINE_S + 1.0, took
            assert isinstance(result, PublishResult), result
            assert result.acknowledged == ("a",)
            assert result.missing == ("b",)
            survivor_has(version)
            caught_up = version
            if fault == "kill":
                assert receivers["b"].wait(10) == -signal.SIGKILL
                start_receiver("b", f"kill:{version + 2}")
            else:
                receivers["b"].cont()
            until(
                lambda v=caught_up: (status("b") or {}).get("version") == v,
                f"b catching up to version {caught_up} from the file",
            )
            assert status("b")["source"] == "file"  # type: ignore[index]
            version += 1
            result, took = publish(version)
            assert isinstance(result, PublishResult), result
            assert result.acknowledged == ("a", "b")
            assert took <= DEADLINE_S + 1.0, took
            if fault == "stop":
                receivers["b"].kill()
                start_receiver("b", f"stop:{version + 1}")
    finally:
        publisher.close()
