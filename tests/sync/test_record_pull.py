"""Pulling records between nodes: exactly once from two sources, resumable, and P2PSyncClient."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from net import PeerClient
from sync import (
    GAMES_SCHEMA,
    P2PSyncClient,
    PullResult,
    RecordPullError,
    RecordStore,
    RecordStores,
    SinceQuery,
    pull_records,
)
from sync.records import pull as pull_module
from sync.records.pull import next_hint
from tests.sync.record_fixtures import SMALL, base_url, game, peers, serve, session
from tests.sync.record_proxy import FaultyProxy

__all__ = ["peers", "session"]


@pytest.fixture
async def sources(tmp_path: Path) -> AsyncIterator[tuple[TestServer, TestServer]]:
    """Peer A holds games 0-6999, peer B games 3000-9999 (4,000 in common)."""
    async with (
        RecordStores(tmp_path / "a", options=SMALL) as a,
        RecordStores(tmp_path / "b", options=SMALL) as b,
    ):
        for start in range(0, 7000, 3500):
            await a["games"].ingest([game(i) for i in range(start, start + 3500)], "peer-a")
            await b["games"].ingest([game(i) for i in range(3000 + start, 6500 + start)], "peer-b")
        async with serve(a, "peer-a") as server_a, serve(b, "peer-b") as server_b:
            yield server_a, server_b


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[RecordStore]:
    async with RecordStore(tmp_path / "local" / "games.db", GAMES_SCHEMA, SMALL) as store:
        yield store


async def all_ids(store: RecordStore) -> list[str]:
    page = await store.since(SinceQuery(limit=10_000))
    return [record["game_id"] for record in page.records]


async def test_pull_from_two_sources_inserts_each_record_once(
    sources: tuple[TestServer, TestServer],
    local: RecordStore,
    session: aiohttp.ClientSession,
    peers: PeerClient,
) -> None:
    server_a, server_b = sources
    from_a = await pull_records(peers, base_url(server_a), "games", local)
    assert (from_a.pulled, from_a.inserted, from_a.duplicates) == (7000, 7000, 0)
    assert from_a.cursor == (1_700_006_999.0, "g-006999")
    from_b = await pull_records(peers, base_url(server_b), "games", local, limit=999)
    assert (from_b.pulled, from_b.inserted, from_b.duplicates) == (7000, 3000, 4000)
    assert await all_ids(local) == [f"g-{i:06d}" for i in range(10_000)]
    assert local.status().count == 10_000
    [kept] = await local.get(["g-004000"])
    assert kept == {**game(4000), "source_node": "peer-a"}  # the first copy wins, unchanged

    nothing_new = await pull_records(peers, base_url(server_a), "games", local, from_a.cursor)
    assert nothing_new == PullResult(0, 0, 0, from_a.cursor)
    again = await pull_records(peers, base_url(server_b), "games", local, limit=5000)
    assert (again.pulled, again.inserted, again.duplicates) == (7000, 0, 7000)


async def test_a_pull_resumes_from_its_cursor(
    sources: tuple[TestServer, TestServer],
    local: RecordStore,
    session: aiohttp.ClientSession,
    peers: PeerClient,
) -> None:
    url = base_url(sources[0])
    first = await pull_records(peers, url, "games", local, limit=1000, max_records=2500)
    assert (first.pulled, first.inserted) == (3000, 3000)
    assert first.cursor == (1_700_002_999.0, "g-002999")
    rest = await pull_records(peers, url, "games", local, first.cursor, limit=1000)
    assert (rest.pulled, rest.inserted, rest.duplicates) == (4000, 4000, 0)
    filtered = await pull_records(
        peers, url, "games", local, filters={"min_quality": 0.9, "board_type": "hex8"}
    )
    assert (filtered.pulled, filtered.inserted) == (700, 0)


async def test_a_failed_pull_reports_what_it_committed(
    sources: tuple[TestServer, TestServer],
    local: RecordStore,
    session: aiohttp.ClientSession,
    peers: PeerClient,
) -> None:
    async with FaultyProxy(sources[0].port or 0) as proxy:
        proxy.pass_requests, proxy.fail_503 = 2, 1
        with pytest.raises(RecordPullError, match="HTTP 503") as info:
            await pull_records(peers, proxy.url, "games", local, limit=1000)
        partial = info.value.result
        assert (partial.pulled, partial.inserted) == (2000, 2000)
        assert partial.cursor == (1_700_001_999.0, "g-001999")
        rest = await pull_records(peers, proxy.url, "games", local, partial.cursor)
        assert (rest.pulled, rest.inserted) == (5000, 5000)
    assert local.status().count == 7000
    with pytest.raises(RecordPullError, match="bogus: unknown parameter") as bad:
        await pull_records(peers, base_url(sources[0]), "games", local, filters={"bogus": 1})
    assert bad.value.result == PullResult(0, 0, 0, None)


async def test_p2p_sync_client(sources: tuple[TestServer, TestServer], local: RecordStore) -> None:
    server_a = sources[0]
    async with P2PSyncClient("127.0.0.1", server_a.port or 0, node_id="node-c") as peer:
        status = await peer.get_status()
        assert (status["store"], status["count"]) == ("games", 7000)
        assert status["newest_created_at"] == 1_700_006_999.0
        wanted = [f"g-{i:06d}" for i in range(0, 9000, 30)]  # 300 ids, 3 requests
        games = await peer.get_games(wanted)
        assert [g["game_id"] for g in games] == wanted[: len(range(0, 7000, 30))]
        recent = await peer.pull_games_since(1_700_005_500.0)
        assert [g["game_id"] for g in recent] == [f"g-{i:06d}" for i in range(5500, 7000)]
        assert recent[0] == {**game(5500), "source_node": "peer-a"}
        result = await peer.pull_into(local, (1_700_006_000.0, None))
        assert (result.pulled, result.inserted) == (1000, 1000)
    await peer.close()


async def test_a_peer_that_repeats_its_page_stops_the_pull(
    local: RecordStore,
    session: aiohttp.ClientSession,
    peers: PeerClient,
) -> None:
    async def same_page(request: web.Request) -> web.Response:
        page = [game(1), game(2)]
        return web.json_response({"records": page, "next": {"ts": 0.0, "after": "g-000000"}})

    app = web.Application()
    app.router.add_get("/v1/records/games/since", same_page)
    async with TestServer(app, host="127.0.0.1", port=0) as stuck:
        with pytest.raises(RecordPullError, match="not after") as info:
            await pull_records(peers, base_url(stuck), "games", local, limit=2)
    assert (info.value.result.pulled, info.value.result.inserted) == (2, 2)
    assert local.status().count == 2


def test_next_hint_reads_the_cursor_at_the_tail_of_a_page() -> None:
    page = (
        b'{"records":[{"game_id":"g-1","meta":{"a":0,"next":1}}],"next":{"ts":2.5,"after":"g-1"}}'
    )
    assert next_hint(page) == (2.5, "g-1")
    assert next_hint(b'{"records":[],"next":{"ts":3,"after":7}}') == (3.0, 7)
    assert next_hint(b'{"records":[],"next":null}') is None
    assert next_hint(b'{"records":[{"a":1,"next":{"ts":1,"after":"x"}}]}') is None
    assert next_hint(b'{"records":[], "next": {"ts": 1.0, "after": "x"}}') is None
    assert next_hint(b'{"records":[],"next":{"ts":"1","after":"x"}}') is None
    assert next_hint(b'{"records":[],"next":{"ts":1,"after":[1]}}') is None
    assert next_hint(b'{"records":[],"next":{"ts":1,') is None


async def test_the_next_page_is_asked_for_before_the_page_is_parsed(
    sources: tuple[TestServer, TestServer],
    local: RecordStore,
    session: aiohttp.ClientSession,
    peers: PeerClient,
) -> None:
    """Each page (but the last) is parsed only once the request of the following page reached
    the peer: parsing waits for it (in its worker thread), and fails if it never comes."""
    asked: list[str | None] = []
    arrivals = [threading.Event() for _ in range(8)]
    url = base_url(sources[0])

    async def relay(request: web.Request) -> web.Response:
        arrivals[len(asked)].set()
        asked.append(request.query.get("after"))
        async with session.get(f"{url}/v1/records/games/since", params=request.query) as answer:
            return web.Response(body=await answer.read(), content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/records/games/since", relay)
    parse = pull_module.parse_page
    parsed: list[int] = []

    def parse_when_next_asked(*args: Any) -> Any:
        page = len(parsed)
        parsed.append(page)
        if page < 3 and not arrivals[page + 1].wait(10.0):
            raise AssertionError(f"page {page} is parsed and the next one was not asked for")
        return parse(*args)

    async with TestServer(app, host="127.0.0.1", port=0) as relay_server:
        with mock.patch.object(pull_module, "parse_page", parse_when_next_asked):
            result = await pull_records(peers, base_url(relay_server), "games", local, limit=2000)
    assert (result.pulled, result.inserted) == (7000, 7000)
    assert asked == [None, "g-001999", "g-003999", "g-005999"]


async def test_a_page_is_parsed_while_the_page_before_commits(
    sources: tuple[TestServer, TestServer],
    local: RecordStore,
    session: aiohttp.ClientSession,
    peers: PeerClient,
) -> None:
    """The commit of the first page is held until the second page is being parsed: the pull
    only finishes if it does not wait for a commit before parsing the next page."""
    loop = asyncio.get_running_loop()
    second_parsed = asyncio.Event()
    parse = pull_module.parse_page
    parses: list[int] = []

    def parse_and_tell(*args: Any) -> Any:
        parses.append(len(parses))
        if len(parses) == 2:
            loop.call_soon_threadsafe(second_parsed.set)
        return parse(*args)

    ingest = local.ingest_rows
    commits: list[int] = []

    async def held_ingest(rows: Any, wait_s: float | None = None) -> Any:
        if not commits:
            async with asyncio.timeout(10.0):
                await second_parsed.wait()
        commits.append(len(rows))
        return await ingest(rows, wait_s)

    with (
        mock.patch.object(pull_module, "parse_page", parse_and_tell),
        mock.patch.object(local, "ingest_rows", held_ingest),
    ):
        result = await pull_records(peers, base_url(sources[0]), "games", local, limit=3000)
    assert (result.pulled, result.inserted) == (7000, 7000)
    assert commits == [3000, 3000, 1000]


async def test_a_wrong_next_cursor_at_the_tail_is_not_trusted(
    sources: tuple[TestServer, TestServer],
    local: RecordStore,
    session: aiohttp.ClientSession,
    peers: PeerClient,
) -> None:
    """A peer whose `next` is not the end of its page: the early request made from it is
    dropped and the pull goes on from the page's real end, missing nothing."""
    url = base_url(sources[0])
    asked: list[str | None] = []

    async def skewed(request: web.Request) -> web.Response:
        asked.append(request.query.get("after"))
        async with session.get(f"{url}/v1/records/games/since", params=request.query) as answer:
            page = await answer.json()
        if page["next"] is not None:
            page["next"] = {"ts": page["next"]["ts"] + 500, "after": "g-zzz"}
        return web.Response(body=orjson.dumps(page), content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/records/games/since", skewed)
    async with TestServer(app, host="127.0.0.1", port=0) as peer:
        result = await pull_records(peers, base_url(peer), "games", local, limit=3000)
    assert (result.pulled, result.inserted) == (7000, 7000)
    assert result.cursor == (1_700_006_999.0, "g-006999")
    assert await all_ids(local) == [f"g-{i:06d}" for i in range(7000)]
    assert [a for a in asked if a != "g-zzz"] == [None, "g-002999", "g-005999"]
