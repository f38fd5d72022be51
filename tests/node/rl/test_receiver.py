"""WeightReceiver without a broadcast: wait_fresh's backpressure and catch-up from the newest
weights file (verified by its digest, reported with source "file")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from config import Role
from node.errors import WeightsError
from node.plan import FENCE_HEADER, GroupSpec, RolePlan
from node.rl.routes import WeightsRoutes
from node.rl.service import WeightsService

torch = pytest.importorskip("torch")

from node.rl.digest import PWS_ALGO, SHA256_ALGO, weights_digest  # noqa: E402
from node.rl.files import weights_files, write_weights_file  # noqa: E402
from node.rl.receiver import WeightReceiver  # noqa: E402

PLAN = RolePlan(
    term=1,
    version=1,
    roles={"t": Role.TRAINING, "g": Role.SELFPLAY},
    training_ranks=("t",),
    group=GroupSpec("127.0.0.1", 29500, 1, "gloo"),
)


async def serve(service: WeightsService) -> TestServer:
    app = web.Application()
    app.add_routes(WeightsRoutes(service).routes())
    app.router.add_get("/v1/rendezvous", WeightsRoutes(service).rendezvous)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(5, 3)


async def test_wait_fresh_blocks_while_more_than_max_lag_behind() -> None:
    urls: dict[str, str] = {}
    service = WeightsService("g", lambda: PLAN, urls.get, registry=CollectorRegistry())
    server = await serve(service)
    urls["g"] = str(server.make_url("")).rstrip("/")
    try:
        receiver = WeightReceiver("r1", urls["g"])
        assert await asyncio.to_thread(receiver.wait_fresh, 0, 0.2) == 0  # nothing offered yet
        offer = {
            "run": "r1",
            "version": 5,
            "params": [],
            "total_bytes": 0,
            "sha256": "0" * 64,
            "deadline_s": 1.0,
            "group": {"master_addr": "127.0.0.1", "master_port": 1},
        }
        async with ClientSession() as session:
            url = str(server.make_url("/v1/weights/update"))
            async with session.post(url, json=offer, headers={FENCE_HEADER: "1.1"}) as response:
                assert response.status == 200
        assert await asyncio.to_thread(receiver.offered_version) == 5
        with pytest.raises(WeightsError, match="6 versions behind"):
            await asyncio.to_thread(receiver.wait_fresh, 2, 0.3)
        receiver.version = 3
        assert await asyncio.to_thread(receiver.wait_fresh, 2, 0.3) == 2
        newer = {**offer, "version": 6, "digest": {"algo": "shoal-pws64-v9", "value": "0" * 64}}
        del newer["sha256"]
        async with ClientSession() as session:
            url = str(server.make_url("/v1/weights/update"))
            async with session.post(url, json=newer, headers={FENCE_HEADER: "1.1"}) as response:
                assert response.status == 200
        with pytest.raises(WeightsError, match="'shoal-pws64-v9' is not known to this release"):
            # refused before saying ready on the store (none listens at 127.0.0.1:1)
            await asyncio.to_thread(receiver.receive_into, torch.nn.Linear(1, 1), None, None, 1.0)
        receiver.close()
    finally:
        await server.close()


async def test_catch_up_loads_the_newest_file_and_reports_it(tmp_path: Path) -> None:
    urls: dict[str, str] = {}
    service = WeightsService("g", lambda: PLAN, urls.get, registry=CollectorRegistry())
    server = await serve(service)
    urls["g"] = str(server.make_url("")).rstrip("/")
    models = tmp_path / "models"
    try:
        for version in (1, 2, 3):
            write_weights_file(models, "r1", version, net(version), keep=2)
        assert [v for v, _ in weights_files(models, "r1")] == [2, 3]
        receiver = WeightReceiver("r1", urls["g"], models_dir=models)
        model = net(99)
        assert await asyncio.to_thread(receiver.catch_up, model) == 3
        assert weights_digest(model) == weights_digest(net(3))
        status = service.state("r1").status
        assert status is not None
        assert (status.version, status.source) == (3, "file")
        assert status.digest.model_dump() == weights_digest(net(3), SHA256_ALGO).to_dict()
        assert status.sha256 == weights_digest(net(3), SHA256_ALGO).value
        assert await asyncio.to_thread(receiver.catch_up, model) is None  # nothing newer
        path = write_weights_file(models, "r1", 4, net(4))
        document = torch.load(path, weights_only=True)
        document["sha256"] = "f" * 64
        torch.save(document, path)
        with pytest.raises(WeightsError, match="sha256"):
            await asyncio.to_thread(receiver.catch_up, model)
        assert weights_digest(model) == weights_digest(net(3))  # left untouched
    finally:
        await server.close()


async def test_a_file_keeps_sha256_and_the_publishs_digest_both_checked_on_the_cpu(
    tmp_path: Path,
) -> None:
    urls: dict[str, str] = {}
    service = WeightsService("g", lambda: PLAN, urls.get, registry=CollectorRegistry())
    server = await serve(service)
    urls["g"] = str(server.make_url("")).rstrip("/")
    models = tmp_path / "models"
    try:
        published = weights_digest(net(5), PWS_ALGO)
        path = write_weights_file(models, "r1", 5, net(5), digest=published)
        document = torch.load(path, weights_only=True)
        assert document["sha256"] == weights_digest(net(5), SHA256_ALGO).value
        assert document["digest"] == published.to_dict()
        receiver = WeightReceiver("r1", urls["g"], models_dir=models)
        model = net(99)
        assert await asyncio.to_thread(receiver.catch_up, model) == 5
        status = service.state("r1").status
        assert status is not None
        assert status.digest.model_dump() == published.to_dict()  # what the publisher acknowledges
        path = write_weights_file(models, "r1", 6, net(6), digest=published)  # not net(6)'s
        with pytest.raises(WeightsError, match=f"its {PWS_ALGO} digest"):
            await asyncio.to_thread(receiver.catch_up, model)
        assert weights_digest(model) == weights_digest(net(5))  # left untouched
    finally:
        await server.close()
