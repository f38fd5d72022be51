"""The typed JSON of record stores: a store's status read back field by field (a malformed one
refused naming the field, also by P2PSyncClient.get_status), a page's cursor."""

from __future__ import annotations

import typing

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sync import P2PSyncClient, RecordRequestError
from sync.records.types import (
    CursorJson,
    RecordPage,
    RecordPageJson,
    StoreStatus,
    StoreStatusJson,
)

STATUS = StoreStatus("games", 7, 1_700_000_000.5, 4096)


def test_a_store_status_reads_back_as_itself() -> None:
    data = STATUS.to_json()
    assert data == {"store": "games", "count": 7, "newest_created_at": 1_700_000_000.5,
                    "size_bytes": 4096}  # fmt: skip
    assert set(data) == set(typing.get_type_hints(StoreStatusJson))
    assert StoreStatus.from_json(data) == STATUS
    empty = StoreStatus("games", 0, None, 0)
    assert StoreStatus.from_json(empty.to_json()) == empty
    assert StoreStatus.from_json({**data, "newest_created_at": 5}).newest_created_at == 5.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("store", None), ("store", 3), ("count", -1), ("count", "7"), ("count", True),
     ("newest_created_at", "soon"), ("newest_created_at", False), ("size_bytes", 1.5)],
)  # fmt: skip
def test_a_malformed_store_status_is_refused_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"'{field}'"):
        StoreStatus.from_json({**STATUS.to_json(), field: value})
    with pytest.raises(ValueError, match="JSON object"):
        StoreStatus.from_json([STATUS.to_json()])


def test_a_pages_cursor_is_ts_and_after() -> None:
    page = RecordPage([{"game_id": "g"}], (5.0, "g"))
    data = page.to_json()
    assert data == {"records": [{"game_id": "g"}], "next": {"ts": 5.0, "after": "g"}}
    assert set(data) == set(typing.get_type_hints(RecordPageJson))
    assert data["next"] is not None
    assert set(data["next"]) == set(typing.get_type_hints(CursorJson))
    assert RecordPage([], None).to_json() == {"records": [], "next": None}


async def test_the_sync_client_refuses_a_malformed_status_naming_the_field() -> None:
    async def status(request: web.Request) -> web.Response:
        return web.json_response({**STATUS.to_json(), "count": "many"})

    app = web.Application()
    app.router.add_get("/v1/records/games/status", status)
    async with (
        TestServer(app, host="127.0.0.1") as server,
        P2PSyncClient("127.0.0.1", server.port or 0) as client,
    ):
        with pytest.raises(RecordRequestError, match="'count'"):
            await client.get_status()
