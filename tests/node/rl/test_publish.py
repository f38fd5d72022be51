"""WeightPublisher and WeightReceiver through three daemons' weights planes: every receiver gets
each version; a receiver killed or stopped mid-broadcast costs the trainer at most deadline + 1 s,
names the receiver, the next publish proceeds without it, and it catches up from the file."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from threading import Timer

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from config import Role
from node.errors import PublishTimeout, WeightsError
from node.plan import GroupSpec, RolePlan
from node.rl.digest import PWS_ALGO, SHA256_ALGO, weights_digest
from node.rl.group import TensorDevice, weights_port
from node.rl.publisher import FILE_GRACE_S, PublishResult, WeightPublisher, store_key_prefix
from node.rl.routes import WeightsRoutes
from node.rl.service import WeightsService

torch = pytest.importorskip("torch")

CHILD = Path(__file__).with_name("receiver_child.py")
DEADLINE_S = 2.0
ROUNDS = int(os.environ.get("SHOAL_RL_FAULT_ROUNDS", "2"))
RUN = "r1"


@dataclass
class Cluster:
    services: dict[str, WeightsService]
    urls: dict[str, str]
    models_dir: Path
    children: dict[str, subprocess.Popen[str]]
    logs: dict[str, Path]

    def start_receiver(self, node: str, fault: str = "none") -> None:
        old = self.children.get(node)
        if old is not None:
            old.wait(10)
        self.logs[node] = self.models_dir.parent / f"{node}-{len(self.logs)}-{time.time_ns()}.log"
        with self.logs[node].open("w") as out:
            self.children[node] = subprocess.Popen(
                [sys.executable, str(CHILD), self.urls[node], RUN, str(self.models_dir), fault],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def status(self, node: str) -> dict[str, object] | None:
        """The node's weights status as its route answers it (None: no weights yet)."""
        status = self.services[node].state(RUN).status
        return None if status is None else status.to_json()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    port = free_port()
    while port < 3000:
        port = free_port()
    plan = RolePlan(
        term=1,
        version=1,
        roles={"t": Role.TRAINING, "a": Role.INFERENCE, "b": Role.SELFPLAY},
        training_ranks=("t",),
        group=GroupSpec("127.0.0.1", port - (weights_port(0, RUN)), 1, "gloo"),
        weights_generation=1,
    )
    urls: dict[str, str] = {}
    services = {
        node: WeightsService(node, lambda: plan, urls.get, registry=CollectorRegistry())
        for node in ("t", "a", "b")
    }
    servers = []
    for node, service in services.items():
        app = web.Application()
        app.add_routes(WeightsRoutes(service).routes())
        app.router.add_get("/v1/rendezvous", WeightsRoutes(service).rendezvous)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        urls[node] = str(server.make_url("")).rstrip("/")
    state = Cluster(services, urls, tmp_path / "models", {}, {})
    try:
        yield state
    finally:
        for child in state.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGCONT)
                child.kill()
            child.wait()
        for server in servers:
            await server.close()


def model_at(step: int) -> torch.nn.Module:
    torch.manual_seed(7)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    with torch.no_grad():
        for param in net.parameters():
            param.add_(0.01 * step)
    return net


async def publish(
    publisher: WeightPublisher, version: int
) -> tuple[PublishResult | Exception, float]:
    started = time.monotonic()
    try:
        result: PublishResult | Exception = await asyncio.to_thread(
            publisher.publish, model_at(version), version
        )
    except PublishTimeout as exc:
        result = exc
    return result, time.monotonic() - started


async def until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def wait_started(cluster: Cluster, node: str) -> None:
    log = cluster.logs[node]
    await until(lambda: '"started"' in log.read_text())


@pytest.mark.parametrize("fault", ["kill", "stop"])
async def test_a_dead_or_stalled_receiver_cannot_hang_the_trainer(
    cluster: Cluster, fault: str
) -> None:
    publisher = WeightPublisher(
        RUN, cluster.urls["t"], models_dir=cluster.models_dir, deadline_s=DEADLINE_S, join_s=1.0
    )
    version = 1
    cluster.start_receiver("a")
    cluster.start_receiver("b", f"{fault}:2")
    await wait_started(cluster, "a")
    await wait_started(cluster, "b")
    try:
        result, took = await publish(publisher, version)
        assert isinstance(result, PublishResult), result
        assert result.acknowledged == ("a", "b")
        phases = ["prepare", "offer", "ready", "broadcast", "ack", "file", "record"]
        assert list(result.phases_s) == phases  # every step of the publish, the WAL record last
        assert sum(result.phases_s.values()) <= result.total_s
        for node in ("a", "b"):
            assert cluster.status(node)["digest"] == result.digest.to_dict()  # type: ignore[index]
        for _ in range(ROUNDS):
            version += 1
            result, took = await publish(publisher, version)
            assert took <= DEADLINE_S + 1.0, took
            assert isinstance(result, PublishTimeout), result
            assert "b" in result.receivers
            assert "b" in str(result)
            version += 1
            result, took = await publish(publisher, version)
            assert took <= DEADLINE_S + 1.0, took
            assert isinstance(result, PublishResult), result
            assert result.acknowledged == ("a",)
            assert result.missing == ("b",)
            survivor = cluster.status("a")
            assert survivor is not None
            assert survivor["version"] == version
            assert survivor["source"] == "broadcast"
            caught_up = version
            if fault == "kill":
                assert cluster.children["b"].wait(10) == -signal.SIGKILL
                cluster.start_receiver("b", f"kill:{version + 2}")
            else:
                cluster.children["b"].send_signal(signal.SIGCONT)
            await until(lambda v=caught_up: (cluster.status("b") or {}).get("version") == v)
            assert cluster.status("b")["source"] == "file"  # type: ignore[index]
            version += 1
            result, took = await publish(publisher, version)
            assert isinstance(result, PublishResult), result
            assert result.acknowledged == ("a", "b")
            assert took <= DEADLINE_S + 1.0
            if fault == "stop":
                cluster.children["b"].send_signal(signal.SIGKILL)
                cluster.children["b"].wait(10)
                cluster.start_receiver("b", f"stop:{version + 1}")
                await wait_started(cluster, "b")
    finally:
        publisher.close()


async def test_a_publish_with_the_device_digest_is_verified_and_acknowledged(
    cluster: Cluster,
) -> None:
    """shoal-pws64-v1 end to end: the offer, every receiver's check while buckets land, the
    acknowledgement by digest; receivers say ready with their device and, all on the CPU, the
    publisher announces a gloo group."""
    cluster.start_receiver("a")
    cluster.start_receiver("b")
    await wait_started(cluster, "a")
    await wait_started(cluster, "b")
    with WeightPublisher(
        RUN, cluster.urls["t"], deadline_s=30.0, join_s=20.0, digest_algo=PWS_ALGO
    ) as publisher:
        pools = []
        for version in (1, 2):  # the second reuses the group, the pool and the buffers
            result, _ = await publish(publisher, version)
            pools.append(publisher._pool)
            assert isinstance(result, PublishResult), result
            assert result.acknowledged == ("a", "b")
            assert result.digest == weights_digest(model_at(version), PWS_ALGO)
            for node in ("a", "b"):
                status = cluster.status(node)
                assert status is not None
                assert status["digest"] == result.digest.to_dict()
                assert "sha256" not in status
            prefix = f"{store_key_prefix(RUN)}/v{version}"
            store = publisher._store
            announced = json.loads(store.get(f"{prefix}/members"))
            assert announced["backend"] == "gloo"
            ready = TensorDevice.from_ready(store.get(f"{prefix}/ready/a"))
            assert ready == TensorDevice("cpu")
        assert pools[0] is not None
        assert pools[1] is pools[0]  # one hash pool for the publisher's life
    assert publisher._pool is None  # closed with the publisher


def test_the_digest_algo_follows_the_weights_device_unless_chosen() -> None:
    model = model_at(0)
    assert WeightPublisher(RUN, "http://127.0.0.1:9").algo_for(model) == SHA256_ALGO
    chosen = WeightPublisher(RUN, "http://127.0.0.1:9", digest_algo=PWS_ALGO)
    assert chosen.algo_for(model) == PWS_ALGO
    with pytest.raises(WeightsError, match="digest_algo 'md5'"):
        WeightPublisher(RUN, "http://127.0.0.1:9", digest_algo="md5")


def test_the_weights_file_may_finish_in_the_grace_after_the_deadline_and_no_later(
    tmp_path: Path,
) -> None:
    """The file write runs beside the broadcast; publish waits for it FILE_GRACE_S past the
    deadline (inside deadline + 1 s), then names the models dir it could not write in time."""
    assert 0 < FILE_GRACE_S < 1.0
    publisher = WeightPublisher(RUN, "http://127.0.0.1:9", models_dir=tmp_path, deadline_s=1.0)
    late: Future[Path] = Future()
    Timer(FILE_GRACE_S / 2, late.set_result, [tmp_path / "w.pt"]).start()
    deadline = time.monotonic()  # the broadcast took the whole deadline
    assert publisher._file_written(late, 3, deadline) == tmp_path / "w.pt"
    with pytest.raises(WeightsError, match=f"version 4: the weights file .* {tmp_path}"):
        publisher._file_written(Future(), 4, time.monotonic())
    assert publisher._file_written(None, 5, time.monotonic()) is None
