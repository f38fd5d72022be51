"""The weights control plane of a daemon: fenced offers, the long poll, applied reports, status,
metrics, the WAL record, and the weights group at GET /v1/rendezvous?group=weights."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel

from config import Role
from node.daemon import NodeDaemon
from node.election.roles import NodeCapabilities, RolePolicy, compute_plan
from node.errors import BodyError, PeerRequestError
from node.openapi import BODY_CONFIG, parse_body
from node.plan import FENCE_HEADER, GroupSpec, RolePlan
from node.rl.client import post_digested
from node.rl.digest import PWS_ALGO, SHA256_ALGO, Digest
from node.rl.group import (
    TensorDevice,
    WeightsRendezvous,
    device_of,
    weights_backend,
    weights_port,
    weights_rendezvous_for,
)
from node.rl.routes import WeightsRoutes
from node.rl.service import WAL_ENTRY, WeightsService
from node.security import json_error
from node.training.rendezvous import daemon_endpoint
from tests.node.daemons import test_settings
from wal import WriteAheadLog

SHA = "ab" * 32


def plan(version: int = 1) -> RolePlan:
    return RolePlan(
        term=3,
        version=version,
        roles={"t": Role.TRAINING, "b": Role.INFERENCE, "a": Role.SELFPLAY},
        training_ranks=("t",),
        group=GroupSpec("10.0.0.1", 29500, 1, "gloo"),
        weights_generation=2,
    )


def url_of(node: str) -> str | None:
    return {"t": "http://t:1", "a": "http://a:1", "b": "http://b:1"}.get(node)


def offer(version: int, run: str = "r1") -> dict[str, Any]:
    return {
        "run": run,
        "version": version,
        "params": [{"name": "w", "shape": [2], "dtype": "float32", "nbytes": 8}],
        "total_bytes": 8,
        "sha256": SHA,
        "deadline_s": 5.0,
        "sent_at": 100.0,
    }


async def serve(service: WeightsService) -> TestServer:
    app = web.Application()
    app.add_routes(WeightsRoutes(service).routes())
    app.router.add_get("/v1/rendezvous", WeightsRoutes(service).rendezvous)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def test_the_weights_group_is_the_trainer_then_every_receiver() -> None:
    found = weights_rendezvous_for(plan(), "b", "r1", url_of)
    assert found is not None
    assert found.members == ("t", "a", "b")
    assert found.rank == 2
    assert found.publisher == "t"
    assert found.master_port == weights_port(29500, "r1")
    assert found.master_port > 29500 + 999
    assert weights_port(29500, "r1") != weights_port(29500, "r2")
    assert WeightsRendezvous.from_dict(found.to_dict()) == found
    no_address = weights_rendezvous_for(plan(), "t", "r1", lambda n: None if n == "a" else "u")
    assert no_address is not None
    assert no_address.members == ("t", "b")
    assert weights_rendezvous_for(None, "t", "r1", url_of) is None


def test_the_weights_generation_changes_only_with_the_weights_group() -> None:
    policy = RolePolicy(min_training=1, max_training=1, backend="gloo")
    t = NodeCapabilities("t", "10.0.0.1", preference=Role.TRAINING)
    a = NodeCapabilities("a", "10.0.0.2", preference=Role.INFERENCE)
    b = NodeCapabilities("b", "10.0.0.3", preference=Role.SELFPLAY)
    first = compute_plan(1, 1, [t, a], policy)
    assert first.weights_generation == 1
    again = compute_plan(1, 2, [a, t], policy, previous=first)
    assert again.weights_generation == 1
    joined = compute_plan(1, 3, [t, a, b], policy, previous=again)
    assert joined.weights_generation == 2
    assert joined.weights_members() == ("t", "a", "b")
    assert joined.generation == first.generation  # the training group did not change
    assert RolePlan.from_dict(joined.to_dict()) == joined


async def test_offers_are_fenced_and_versions_strictly_increase() -> None:
    current = [plan()]
    service = WeightsService("b", lambda: current[0], url_of, registry=CollectorRegistry())
    server = await serve(service)
    fence = {FENCE_HEADER: "3.1"}
    try:
        async with ClientSession() as session:
            url = str(server.make_url("/v1/weights/update"))
            async with session.post(url, json=offer(1)) as response:
                assert response.status == 409
                assert (await response.json())["error"] == "stale_fence"
            async with session.post(url, json=offer(1), headers={FENCE_HEADER: "3.0"}) as response:
                assert response.status == 409
            async with session.post(url, json=offer(1), headers=fence) as response:
                assert response.status == 200, await response.text()
            for version in (1, 0):
                async with session.post(url, json=offer(version), headers=fence) as response:
                    assert response.status == 409
                    assert (await response.json())["error"] == "old_version"
            async with session.post(url, json=offer(2, run="r2"), headers=fence) as response:
                assert response.status == 200  # versions are per run
            bad = {**offer(5), "sha256": "xyz"}
            async with session.post(url, json=bad, headers=fence) as response:
                assert response.status == 400
                assert (await response.json())["param"] == "sha256"
            current[0] = plan(version=2)
            async with session.post(url, json=offer(5), headers=fence) as response:
                assert response.status == 409  # a newer plan refuses the old fence
    finally:
        await server.close()


async def test_offers_carry_a_digest_and_the_previous_releases_sha256_is_read_as_one() -> None:
    """An offer names its weights by `digest`; an offer of the previous release (sha256 alone)
    is served as digest {algo: sha256} with its sha256 kept for older receivers; a digest of
    another algo is served without sha256 (a sha256 beside it is not read); no digest is 400."""
    service = WeightsService("b", plan, url_of, registry=CollectorRegistry())
    server = await serve(service)
    fence = {FENCE_HEADER: "3.1"}
    update = str(server.make_url("/v1/weights/update"))
    try:
        async with ClientSession() as session:

            async def offered(body: dict[str, Any]) -> dict[str, Any]:
                async with session.post(update, json=body, headers=fence) as response:
                    assert response.status == 200, await response.text()
                after = body["version"] - 1
                poll = f"/v1/weights/next?run=r1&after={after}&timeout_s=0"
                async with session.get(server.make_url(poll)) as response:
                    assert response.status == 200
                    found: dict[str, Any] = await response.json()
                    return found

            old = await offered(offer(1))
            assert old["digest"] == {"algo": SHA256_ALGO, "value": SHA}
            assert old["sha256"] == SHA
            pws = {k: v for k, v in offer(2).items() if k != "sha256"}
            pws["digest"] = {"algo": PWS_ALGO, "value": SHA}
            new = await offered(pws)
            assert new["digest"] == {"algo": PWS_ALGO, "value": SHA}
            assert "sha256" not in new
            both = await offered({**offer(3), "digest": {"algo": SHA256_ALGO, "value": SHA}})
            assert (both["digest"]["value"], both["sha256"]) == (SHA, SHA)
            beside = await offered({**pws, "version": 4, "sha256": "cd" * 32})
            assert beside["digest"] == pws["digest"]  # sha256 is read only without digest
            assert "sha256" not in beside
            for bad in (
                {k: v for k, v in pws.items() if k != "digest"} | {"version": 5},
                {**pws, "version": 5, "digest": {"algo": "Bad Algo", "value": SHA}},
                {**pws, "version": 5, "digest": {"algo": PWS_ALGO, "value": "xyz"}},
                {**pws, "version": 5, "sha256": None},
                {**offer(5), "digest": None},
            ):
                async with session.post(update, json=bad, headers=fence) as response:
                    assert response.status == 400, bad
    finally:
        await server.close()


async def test_the_long_poll_wakes_on_an_offer_and_times_out_empty() -> None:
    service = WeightsService("b", plan, url_of, registry=CollectorRegistry())
    server = await serve(service)
    try:
        async with ClientSession() as session:
            poll = str(server.make_url("/v1/weights/next?run=r1&after=0&timeout_s=0.2"))
            async with session.get(poll) as response:
                assert response.status == 204
            long_poll = str(server.make_url("/v1/weights/next?run=r1&after=0&timeout_s=30"))
            waiting = asyncio.ensure_future(session.get(long_poll))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            update = str(server.make_url("/v1/weights/update"))
            async with session.post(update, json=offer(1), headers={FENCE_HEADER: "3.1"}) as r:
                assert r.status == 200
            response = await asyncio.wait_for(waiting, 10)
            assert response.status == 200
            assert (await response.json())["version"] == 1
            response.release()
            at_one = str(server.make_url("/v1/weights/next?run=r1&after=1&timeout_s=0.1"))
            async with session.get(at_one) as response:
                assert response.status == 204  # nothing newer than what the receiver holds
    finally:
        await server.close()


async def test_applied_reports_set_status_metrics_and_the_wal(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        service = WeightsService("t", plan, url_of, wal=wal, registry=registry, clock=lambda: 101.5)
        server = await serve(service)
        try:
            async with ClientSession() as session:
                status = str(server.make_url("/v1/weights/status?run=r1"))
                async with session.get(status) as response:
                    assert response.status == 404
                report = {
                    "run": "r1",
                    "version": 4,
                    "sha256": SHA,
                    "bytes": 8,
                    "source": "broadcast",
                    "receivers": ["a", "b"],
                    "sent_at": 100.0,
                }
                applied = str(server.make_url("/v1/weights/applied"))
                async with session.post(applied, json=report) as response:
                    assert response.status == 200
                async with session.get(status) as response:
                    assert await response.json() == {  # the previous release's report
                        "run": "r1",
                        "version": 4,
                        "digest": {"algo": "sha256", "value": SHA},
                        "sha256": SHA,
                        "applied_at": 101.5,
                        "source": "broadcast",
                        "bytes": 8,
                    }
                async with session.post(applied, json={**report, "version": 3}) as response:
                    assert response.status == 409
                async with session.post(applied, json={**report, "source": "x"}) as response:
                    assert response.status == 400
                pws = {k: v for k, v in report.items() if k != "sha256"}
                pws |= {"version": 5, "digest": {"algo": PWS_ALGO, "value": SHA}}
                async with session.post(applied, json=pws) as response:
                    assert response.status == 200
                async with session.get(status) as response:
                    shown = await response.json()
                    assert shown["digest"] == {"algo": PWS_ALGO, "value": SHA}
                    assert "sha256" not in shown  # only beside digest algo sha256
        finally:
            await server.close()
        text = generate_latest(registry).decode()
        assert 'shoal_weights_version{run="r1"} 5.0' in text
        assert "shoal_weights_update_seconds_count 2.0" in text
        assert "shoal_weights_update_seconds_sum 3.0" in text
        assert await wal.pending(WAL_ENTRY) == []  # recorded and committed, not left pending
        entry = await wal.get(1)
        assert entry is not None
        assert entry.entry_type == WAL_ENTRY
        assert entry.state.value == "committed"
        assert entry.payload["receivers"] == ["a", "b"]
        assert entry.payload["version"] == 4


async def test_the_daemon_serves_the_weights_plane(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, "solo", role="training", min_training=1, backend="gloo")
    async with NodeDaemon(settings) as daemon, ClientSession() as session:
        base = f"http://127.0.0.1:{daemon.port}"
        for _ in range(100):
            async with session.get(f"{base}/v1/rendezvous?group=weights&run=r1") as response:
                if response.status == 200:
                    body = await response.json()
                    break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no plan in time")
        assert body["group"] == "weights"
        assert body["members"] == ["solo"]
        assert body["rank"] == 0
        async with session.get(f"{base}/v1/rendezvous?group=nope") as response:
            assert response.status == 404
        # found by the fuzz: the weights group took a local_rank the document refuses
        bad = f"{base}/v1/rendezvous?group=weights&run=r1&local_rank=null"
        async with session.get(bad) as response:
            assert (response.status, (await response.json())["param"]) == (400, "local_rank")
        async with session.get(f"{base}/v1/rendezvous") as response:
            assert "members" not in await response.json()  # the training group is unchanged
        async with session.get(f"{base}/v1/weights/status?run=r1") as response:
            assert response.status == 404
        async with session.get(f"{base}/metrics") as response:
            assert "shoal_weights_update_seconds" in await response.text()


async def test_the_weights_routes_refuse_what_their_schema_refuses() -> None:
    """The document's schemas are what the handlers check: the poll's timeout_s at most 60 s,
    no unknown query parameter, and a report body of AppliedBody (no unknown field, no
    integer given as a string)."""
    service = WeightsService("b", plan, url_of, registry=CollectorRegistry())
    server = await serve(service)
    try:
        async with ClientSession() as session:
            for query, param in (
                ("run=r1&timeout_s=61", "timeout_s"),
                ("run=r1&timeout_s=0&extra=1", "extra"),
                ("run=r1&after=9223372036854775808&timeout_s=0", "after"),
            ):
                async with session.get(server.make_url(f"/v1/weights/next?{query}")) as response:
                    assert response.status == 400, query
                    assert (await response.json())["param"] == param
            async with session.get(server.make_url("/v1/weights/status?run=r1&x=1")) as response:
                assert response.status == 400
            applied = str(server.make_url("/v1/weights/applied"))
            report = {"run": "r1", "version": 1, "sha256": SHA, "bytes": 8, "source": "file"}
            for bad, param in (
                ({**report, "extra": 1}, "extra"),
                ({**report, "version": "1"}, "version"),
            ):
                async with session.post(applied, json=bad) as response:
                    body = await response.json()
                    assert response.status == 400, body
                    assert body["param"] == param
                    assert body["reason"].startswith(f"{param}: ")
            async with session.post(applied, json={**report, "version": 1.0}) as response:
                assert response.status == 200  # JSON Schema's integer includes 1.0
    finally:
        await server.close()


def test_the_weights_group_uses_nccl_only_for_distinct_known_cuda_devices() -> None:
    gpu = [TensorDevice("cuda", f"GPU-{i}") for i in range(3)]
    assert weights_backend(gpu[0], gpu[1:], nccl_available=True) == "nccl"
    assert weights_backend(gpu[0], gpu[1:], nccl_available=False) == "gloo"
    assert weights_backend(gpu[0], [gpu[1], gpu[1]], nccl_available=True) == "gloo"  # one GPU
    assert weights_backend(gpu[0], [gpu[0]], nccl_available=True) == "gloo"
    assert weights_backend(gpu[0], [gpu[1], TensorDevice("cpu")], nccl_available=True) == "gloo"
    assert weights_backend(gpu[0], [gpu[1], None], nccl_available=True) == "gloo"  # older
    assert weights_backend(TensorDevice("cuda"), gpu[1:], nccl_available=True) == "gloo"
    assert weights_backend(TensorDevice("cpu"), gpu[1:], nccl_available=True) == "gloo"
    assert weights_backend(gpu[0], [], nccl_available=True) == "gloo"


def test_a_ready_key_carries_the_receivers_device() -> None:
    device = TensorDevice("cuda", "GPU-1")
    assert TensorDevice.from_ready(device.to_json()) == device
    assert TensorDevice.from_ready(device.to_json().encode()) == device
    assert TensorDevice.from_ready(b"1") is None  # the previous release's ready
    assert TensorDevice.from_ready("{}") is None
    assert TensorDevice.from_ready('{"device": {"kind": 3}}') is None


def test_the_device_of_a_cpu_model_is_the_cpu() -> None:
    torch = pytest.importorskip("torch")
    assert device_of(torch.nn.Linear(2, 2)) == TensorDevice("cpu")
    assert device_of(torch.nn.Identity()) == TensorDevice("cpu")


class PreviousReleaseBody(BaseModel):
    """The previous release's body check: sha256 required, no unknown field."""

    model_config = BODY_CONFIG

    run: str
    sha256: str


async def test_a_sha256_digest_reaches_a_daemon_of_the_previous_release() -> None:
    received: list[dict[str, Any]] = []

    async def previous(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            parse_body(PreviousReleaseBody, raw)
        except BodyError as exc:
            return json_error(400, exc.reason, param=exc.field.split(".")[0])
        received.append(json.loads(raw))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/weights/applied", previous)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    endpoint = daemon_endpoint(str(server.make_url("")).rstrip("/"), env={})
    try:
        sha = Digest(SHA256_ALGO, SHA)
        status, _ = await asyncio.to_thread(
            post_digested, endpoint, "/v1/weights/applied", {"run": "r1"}, sha
        )
        assert status == 200
        assert received == [{"run": "r1", "sha256": SHA}]  # again, without the digest field
        with pytest.raises(PeerRequestError, match="HTTP 400") as refused:
            await asyncio.to_thread(
                post_digested,
                endpoint,
                "/v1/weights/applied",
                {"run": "r1"},
                Digest(PWS_ALGO, SHA),
            )
        assert refused.value.status == 400  # it cannot check another algo: no retry
        assert len(received) == 1
    finally:
        await server.close()
