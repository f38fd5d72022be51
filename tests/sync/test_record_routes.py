"""The record endpoints over real HTTP on 127.0.0.1: ingest, refusals, paging, status, lookups."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from multidict import CIMultiDictProxy

from sync import GAMES_SCHEMA, RecordClient, RecordStore, RecordStores, StoreOptions
from tests.sync.record_fixtures import (
    NODE_ID,
    base_url,
    game,
    rollout,
    serve,
    server,
    session,
    stores,
)
from tests.sync.test_record_store import wait_until_pending, write_locked

__all__ = ["server", "session", "stores"]


async def post(
    session: aiohttp.ClientSession,
    server: TestServer,
    path: str,
    body: Any,
    content_type: str = "application/json",
) -> tuple[int, Any, CIMultiDictProxy[str]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    url = f"{base_url(server)}{path}"
    async with session.post(url, data=data, headers={"Content-Type": content_type}) as response:
        return response.status, await response.json(), response.headers


async def get(session: aiohttp.ClientSession, server: TestServer, path: str) -> tuple[int, Any]:
    async with session.get(f"{base_url(server)}{path}") as response:
        return response.status, await response.json()


async def test_ingest_counts_duplicates_within_and_across_requests(
    server: TestServer, session: aiohttp.ClientSession, stores: RecordStores
) -> None:
    status, body, _ = await post(session, server, "/v1/records/games", [game(1), game(2), game(1)])
    assert (status, body) == (200, {"accepted": 2, "duplicates": 1})
    status, body, _ = await post(session, server, "/v1/records/games", [game(2), game(3)])
    assert (status, body) == (200, {"accepted": 1, "duplicates": 1})
    [stored] = await stores["games"].get(["g-000001"])
    assert stored["source_node"] == NODE_ID
    status, body, _ = await post(session, server, "/v1/records/games", [])
    assert (status, body) == (200, {"accepted": 0, "duplicates": 0})


async def test_invalid_record_is_400_naming_it_and_nothing_is_written(
    server: TestServer, session: aiohttp.ClientSession, stores: RecordStores
) -> None:
    records = [game(i) for i in range(30)]
    records[17]["num_players"] = "2"
    status, body, _ = await post(session, server, "/v1/records/games", records)
    assert status == 400
    assert body["reason"] == "records[17].num_players: expected integer"
    assert (body["index"], body["field"], body["error"]) == (17, "num_players", "invalid_record")
    records[17] = game(17, extra=True)
    status, body, _ = await post(session, server, "/v1/records/games", records)
    assert (status, body["reason"]) == (400, "records[17].extra: unknown field")
    assert stores["games"].status().count == 0


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'[{"game_id": ', "records: malformed JSON"),
        (b"NaN", "records: malformed JSON"),
        (b'{"game_id": "a"}', "records: expected a JSON array of objects"),
        (b"\xff\xfe[]", "records: body is not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "records: malformed JSON"),
        (b"[1e999]", "records: malformed JSON"),
    ],
)
async def test_malformed_bodies_are_400_never_500(
    server: TestServer, session: aiohttp.ClientSession, payload: bytes, reason: str
) -> None:
    status, body, _ = await post(session, server, "/v1/records/games", payload)
    assert status == 400
    assert body["reason"].startswith(reason)


async def test_ndjson_ingest_names_the_bad_line(
    server: TestServer, session: aiohttp.ClientSession, stores: RecordStores
) -> None:
    lines = "\n".join(json.dumps(game(i)) for i in range(5)) + "\n\n"
    status, body, _ = await post(
        session, server, "/v1/records/games", lines.encode(), "application/x-ndjson"
    )
    assert (status, body) == (200, {"accepted": 5, "duplicates": 0})
    bad = f"{json.dumps(game(6))}\n{{oops\n".encode()
    status, body, _ = await post(session, server, "/v1/records/games", bad, "application/x-ndjson")
    assert status == 400
    assert body["reason"].startswith("records[1]: malformed JSON on line 2")
    assert stores["games"].status().count == 5


async def test_oversized_request_is_413_with_a_reason(
    stores: RecordStores, session: aiohttp.ClientSession
) -> None:
    async with serve(stores, max_records=10, max_body_bytes=4096) as small:
        status, body, _ = await post(
            session, small, "/v1/records/games", [game(i) for i in range(11)]
        )
        assert (status, body["error"]) == (413, "too_many_records")
        assert "at most 10" in body["reason"]
        status, body, _ = await post(
            session, small, "/v1/records/games", [game(1, moves=["x" * 5000])]
        )
        assert (status, body["error"]) == (413, "too_large")
        assert stores["games"].status().count == 0


async def test_unknown_store_is_404(server: TestServer, session: aiohttp.ClientSession) -> None:
    status, body, _ = await post(session, server, "/v1/records/nope", [game(1)])
    assert (status, body["reason"]) == (404, "unknown record store 'nope'")
    for path in ("/v1/records/nope/status", "/v1/records/nope/since", "/v1/records/nope/get"):
        assert (await get(session, server, path))[0] == 404


async def test_status_since_and_get(server: TestServer, session: aiohttp.ClientSession) -> None:
    await post(session, server, "/v1/records/games", [game(i) for i in range(25)])
    await post(session, server, "/v1/records/rollouts", [rollout(i) for i in range(3)])
    status, body = await get(session, server, "/v1/records/games/status")
    assert status == 200
    assert body["store"] == "games"
    assert (body["count"], body["newest_created_at"]) == (25, 1_700_000_024.0)
    assert body["size_bytes"] > 0
    status, body = await get(session, server, "/v1/records")
    assert [(s["store"], s["count"]) for s in body["stores"]] == [("games", 25), ("rollouts", 3)]

    ids: list[str] = []
    path = "/v1/records/games/since?limit=10"
    while True:
        status, page = await get(session, server, path)
        assert status == 200
        ids.extend(record["game_id"] for record in page["records"])
        if page["next"] is None:
            break
        cursor = page["next"]
        path = f"/v1/records/games/since?limit=10&ts={cursor['ts']!r}&after={cursor['after']}"
    assert ids == [f"g-{i:06d}" for i in range(25)]
    status, page = await get(
        session, server, "/v1/records/games/since?ts=1700000010&min_quality=0.5&board_type=hex8"
    )
    assert [r["game_id"] for r in page["records"]] == ["g-000015", "g-000017", "g-000019"]
    assert page["records"][0] == {**game(15), "source_node": NODE_ID}

    status, body = await get(session, server, "/v1/records/games/get?key=g-000003&key=zz")
    assert (status, [r["game_id"] for r in body["records"]], body["missing"]) == (
        200,
        ["g-000003"],
        ["zz"],
    )


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("ts=abc", "ts"),
        ("limit=0", "limit"),
        ("min_quality=x", "min_quality"),
        ("bogus=1", "bogus"),
    ],
)
async def test_bad_query_is_400_naming_the_parameter(
    server: TestServer, session: aiohttp.ClientSession, query: str, param: str
) -> None:
    status, body = await get(session, server, f"/v1/records/games/since?{query}")
    assert (status, body["param"]) == (400, param)
    assert body["reason"].startswith(f"{param}: ")
    status, body = await get(session, server, "/v1/records/games/get")
    assert (status, body["param"]) == (400, "key")


async def test_twenty_concurrent_producers(server: TestServer, stores: RecordStores) -> None:
    async def producer(number: int) -> tuple[int, int]:
        records = [game(number * 300 + i) for i in range(300)]
        records += [game(i) for i in range(50)]  # every producer also repeats 50 shared games
        async with RecordClient(base_url(server), batch_size=70) as client:
            result = await client.record("games", records)
        return result.accepted, result.duplicates

    results = await asyncio.gather(*(producer(n) for n in range(20)))
    assert sum(accepted for accepted, _ in results) == 6000
    assert sum(duplicates for _, duplicates in results) == 20 * 350 - 6000
    assert stores["games"].status().count == 6000


async def test_full_queue_answers_503_with_retry_after(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    options = StoreOptions(max_pending_records=5, max_wait_s=0.05, retry_after_s=3)
    async with (
        RecordStore(tmp_path / "games.db", GAMES_SCHEMA, options) as store,
        serve({"games": store}) as running,
    ):
        with write_locked(store.path):
            first = asyncio.create_task(
                post(session, running, "/v1/records/games", [game(i) for i in range(5)])
            )
            await wait_until_pending(store, 5)
            status, body, headers = await post(session, running, "/v1/records/games", [game(9)])
            assert (status, body["error"], headers["Retry-After"]) == (503, "busy", "3")
        assert (await first)[:2] == (200, {"accepted": 5, "duplicates": 0})
