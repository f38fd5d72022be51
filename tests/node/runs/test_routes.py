"""The run routes over real HTTP on 127.0.0.1, on a RunService whose locks are a table in
memory: what each route answers, its refusals in the one error shape, and their order."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from node.locks import LockTable
from node.runs import LocalResults, RunService
from node.runs.routes import run_endpoints
from node.security import error_middleware

FETCH = {"key": "runs/r1/v1/out.txt", "node": "v1", "job_id": "r1.0", "path": "out.txt"}


class TableLocks:
    """The seam RunService works through: a table in memory on the coordinator, or (with
    `forward_to` set) a node that forwards each run route to the coordinator, answering its
    status and the body it forwarded."""

    def __init__(self, results_node: str) -> None:
        self.table = LockTable()
        self.forward_to: str | None = None
        self.peers = None
        results = SimpleNamespace(node=results_node)
        self.runtime = SimpleNamespace(
            node_id="n0", address="127.0.0.1", port=1, settings=SimpleNamespace(results=results)
        )

    async def apply(self, operation: Any) -> Any:
        self.table, answer = operation(self.table, 1, time.time())
        return answer

    def is_coordinator(self) -> bool:
        return self.forward_to is None

    async def call_coordinator(
        self, method: str, path: str, body: Any, *, forwarded: bool = False, **sent: Any
    ) -> tuple[int, Any] | None:
        if self.forward_to is None:
            return None
        return 299, {"forwarded_to": self.forward_to, "body": body}

    def url_of(self, node_id: str) -> str | None:
        return None


async def _client(locks: TableLocks, tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    service = RunService(locks, LocalResults(tmp_path), {})  # type: ignore[arg-type]
    app = web.Application(middlewares=[error_middleware])
    app.add_routes(run_endpoints(service))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[tuple[TableLocks, TestClient[Any, Any]]]:
    locks = TableLocks(results_node="elsewhere")
    async for client in _client(locks, tmp_path):
        yield locks, client


async def _json(response: Any) -> tuple[int, Any]:
    return response.status, await response.json()


async def test_runs_are_listed_oldest_first_and_by_group(
    coordinator: tuple[TableLocks, TestClient[Any, Any]],
) -> None:
    _, client = coordinator
    ids = []
    for group in ("a", "b", "a"):
        status, record = await _json(
            await client.post("/v1/runs", json={"argv": ["x"], "group": group})
        )
        assert (status, record["state"], record["group"]) == (201, "queued", group)
        ids.append(record["run_id"])
    status, listed = await _json(await client.get("/v1/runs"))
    assert status == 200
    assert [run["run_id"] for run in listed["runs"]] == ids
    status, listed = await _json(await client.get("/v1/runs", params={"group": "a"}))
    assert [run["run_id"] for run in listed["runs"]] == [ids[0], ids[2]]
    status, one = await _json(await client.get(f"/v1/runs/{ids[1]}"))
    assert (status, one["run_id"], one["group"]) == (200, ids[1], "b")


async def test_a_full_group_refuses_its_next_run_and_others_still_queue(
    coordinator: tuple[TableLocks, TestClient[Any, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("node.runs.service.MAX_PENDING", 2)
    _, client = coordinator
    for _ in range(2):
        assert (await client.post("/v1/runs", json={"argv": ["x"], "group": "a"})).status == 201
    status, answer = await _json(await client.post("/v1/runs", json={"argv": ["x"], "group": "a"}))
    assert (status, answer["error"], answer["status"]) == (429, "run_queue_full", 429)
    assert "group a: 2 runs queued" in answer["reason"]
    assert (await client.post("/v1/runs", json={"argv": ["x"], "group": "b"})).status == 201


async def test_an_unknown_run_is_404_and_an_ended_one_cannot_be_cancelled(
    coordinator: tuple[TableLocks, TestClient[Any, Any]],
) -> None:
    _, client = coordinator
    for response in (await client.get("/v1/runs/nope"), await client.post("/v1/runs/nope/cancel")):
        status, answer = await _json(response)
        assert (status, answer["error"]) == (404, "run_not_found"), answer
        assert "no run 'nope'" in answer["reason"]
    _, record = await _json(await client.post("/v1/runs", json={"argv": ["x"]}))
    cancel = f"/v1/runs/{record['run_id']}/cancel"
    status, cancelled = await _json(await client.post(cancel))
    assert (status, cancelled["state"], cancelled["step"]) == (200, "cancelled", "done")
    status, answer = await _json(await client.post(cancel, json={}))
    assert (status, answer["error"]) == (409, "run_ended")


async def test_a_body_that_is_not_json_is_refused(
    coordinator: tuple[TableLocks, TestClient[Any, Any]],
) -> None:
    _, client = coordinator
    for path in ("/v1/runs", "/v1/results/fetch"):
        status, answer = await _json(await client.post(path, data=b"{not json"))
        assert (status, answer["error"]) == (400, "invalid_run"), path
        assert answer["reason"].startswith("the body is not JSON")


async def test_another_node_forwards_once_the_body_is_checked(
    coordinator: tuple[TableLocks, TestClient[Any, Any]],
) -> None:
    locks, client = coordinator
    locks.forward_to = "n9"
    status, answer = await _json(await client.post("/v1/runs", json={"argv": []}))
    assert (status, answer["error"]) == (400, "invalid_run")
    status, answer = await _json(await client.post("/v1/runs/r/cancel", json={"now": True}))
    assert (status, answer["error"]) == (400, "invalid_run")
    body = {"argv": ["x"], "group": "a"}
    for method, path, sent, forwarded in (
        ("POST", "/v1/runs", body, body),
        ("GET", "/v1/runs", None, None),
        ("GET", "/v1/runs/r", None, None),
        ("POST", "/v1/runs/r/cancel", None, {}),
    ):
        status, answer = await _json(await client.request(method, path, json=sent))
        assert (status, answer) == (299, {"forwarded_to": "n9", "body": forwarded}), path
    assert locks.table.runs == {}


async def test_only_the_results_node_fetches_and_it_checks_the_fetch(tmp_path: Path) -> None:
    async for client in _client(TableLocks(results_node="elsewhere"), tmp_path):
        status, answer = await _json(await client.post("/v1/results/fetch", json={"key": 1}))
        assert (status, answer["error"]) == (409, "not_results_node")
        assert "node n0 is not the results node (elsewhere)" in answer["reason"]
    async for client in _client(TableLocks(results_node="n0"), tmp_path):
        bad = {**FETCH, "key": "runs/r1/v2/out.txt"}
        status, answer = await _json(await client.post("/v1/results/fetch", json=bad))
        assert (status, answer["error"]) == (400, "invalid_fetch")
        status, answer = await _json(await client.post("/v1/results/fetch", json=FETCH))
        assert (status, answer["error"]) == (503, "node_unknown")
        assert answer["reason"] == "node v1 is not in this node's view"
