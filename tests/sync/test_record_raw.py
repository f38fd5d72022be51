"""Array-valued json fields kept as raw JSON text: from the request body to the row and back."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from net import PeerClient
from sync import GAMES_SCHEMA, ROLLOUTS_SCHEMA, RecordStore, RecordStores, pull_records
from sync.errors import RecordValidationError
from sync.records import raw as raw_module
from sync.records import routes as routes_module
from sync.records.pull import fetch_page
from sync.records.raw import RawJson, canonical_strings, loads_cut
from sync.records.routes import parse_body
from sync.records.schema import FieldKind, FieldSpec, RecordSchema
from sync.records.validate import row_to_record, validate_records
from tests.sync.record_fixtures import SMALL, base_url, game, peers, server, session, stores

__all__ = ["peers", "server", "session", "stores"]

MOVES = [f"{'abcdefgh'[i % 8]}{i % 8 + 1}-é{i}" for i in range(120)]
MOVES_TEXT = orjson.dumps(MOVES)


def stored_moves(path: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return dict(conn.execute("SELECT game_id, moves FROM games"))


def body_of(records: list[dict[str, Any]]) -> bytes:
    return orjson.dumps(records)


@pytest.mark.parametrize(
    "span",
    [
        b"[]",
        b'[""]',
        b'["a"]',
        b'["a","b"]',
        b'[",",","]',
        b'["a,b","c:d","{"]',
        '["é","漢字","\u2028"]'.encode(),
    ],
)
def test_canonical_string_arrays_are_recognised_and_are_their_own_round_trip(span: bytes) -> None:
    assert canonical_strings(span)
    assert orjson.dumps(orjson.loads(span)) == span


@pytest.mark.parametrize(
    "span",
    [
        b"[",
        b'["a"',
        b'["a",]',
        b'["a""b"]',
        b'["a" ,"b"]',
        b'["a", "b"]',
        b'["a"b"]',
        b'["a\\"b"]',
        b'["a\\u0041"]',
        b'["a\x01"]',
        b'["a\n"]',
        b"[1]",
        b'["a",1]',
        b'[["a"]]',
        b'["a"],["b"]',
    ],
)
def test_anything_else_is_not_canonical(span: bytes) -> None:
    assert not canonical_strings(span)


def test_array_values_are_cut_without_building_their_elements() -> None:
    records = [game(i, moves=MOVES) for i in range(5)]
    parsed = loads_cut(body_of(records), GAMES_SCHEMA)
    assert [type(record["moves"]) for record in parsed] == [RawJson] * 5
    assert parsed[0]["moves"].text == MOVES_TEXT.decode()
    rows = validate_records(GAMES_SCHEMA, parsed, "n")
    assert rows == validate_records(GAMES_SCHEMA, records, "n")  # the object path, same text
    assert {row[5] for row in rows} == {MOVES_TEXT.decode()}


@pytest.mark.parametrize("compact", [True, False])
def test_values_that_are_not_canonical_take_the_object_path(compact: bool) -> None:
    odd = [
        ["a]b", "c"],  # a bracket inside a string ends the quick span early
        ["e\\2"],  # an escape
        [1, 2, 3],
        ["a", 1],
        [["a", "b"]],
        [["a"], "b"],
        "a string",
    ]
    records = [game(i, moves=moves) for i, moves in enumerate(odd)]
    body = orjson.dumps(records) if compact else json.dumps(records).encode()  # spaces
    parsed = loads_cut(body, GAMES_SCHEMA)
    assert [record["moves"] for record in parsed] == odd
    rows = validate_records(GAMES_SCHEMA, parsed, "n")
    assert [row[5] for row in rows] == [orjson.dumps(moves).decode() for moves in odd]


def test_a_key_inside_a_string_or_a_nested_object_is_not_cut() -> None:
    inside_string = game(1, board_type='x"moves":["a"]')
    body = body_of([inside_string])
    assert b'\\"moves\\":[' in body
    assert loads_cut(body, GAMES_SCHEMA)[0]["board_type"] == 'x"moves":["a"]'
    nested = {"sample_id": "s", "created_at": 1.0, "model_version": 1, "payload": {}}
    nested["payload"] = {"payload": ["a", "b"]}
    [parsed] = loads_cut(body_of([nested]), ROLLOUTS_SCHEMA)
    assert parsed["payload"] == {"payload": ["a", "b"]}
    [row] = validate_records(ROLLOUTS_SCHEMA, [parsed], "n")
    assert row[3] == '{"payload":["a","b"]}'


def test_a_duplicated_key_keeps_the_last_value_as_orjson_does() -> None:
    body = body_of([game(1)])[:-2] + b',"moves":["z"]}]'
    [parsed] = loads_cut(body, GAMES_SCHEMA)
    assert parsed["moves"] == orjson.loads(body)[0]["moves"] == ["z"]


def test_a_cut_value_that_is_not_utf8_is_refused() -> None:
    body = body_of([game(1, moves=["ab"])]).replace(b'"ab"', b'"a\xffb"')
    with pytest.raises(ValueError, match="UTF-8"):
        loads_cut(body, GAMES_SCHEMA)
    with pytest.raises(RecordValidationError, match="not UTF-8"):
        parse_body(body, ndjson=False, schema=GAMES_SCHEMA)


@pytest.mark.parametrize(
    "broken",
    [
        b'"moves":["a","b"],]',
        b'"moves":["a","b"]]',
        b'"moves":["a" "b"]',
        b'"moves":["a",]',
        b'"moves":["a\x01"]',
        b'"moves":["a"',
    ],
)
def test_malformed_arrays_are_refused_as_malformed_json(broken: bytes) -> None:
    body = body_of([game(1, moves=["a", "b"])]).replace(b'"moves":["a","b"]', broken)
    assert body != body_of([game(1, moves=["a", "b"])])
    with pytest.raises(RecordValidationError, match="malformed JSON") as caught:
        parse_body(body, ndjson=False, schema=GAMES_SCHEMA)
    assert caught.value.index is None


def test_the_shape_of_a_raw_array_is_checked() -> None:
    schema = RecordSchema(
        name="notes",
        key="note_id",
        time_column="at",
        fields=(
            FieldSpec("note_id", FieldKind.TEXT),
            FieldSpec("at", FieldKind.REAL),
            FieldSpec("text", FieldKind.JSON, json_shapes=("string", "object")),
            FieldSpec("tags", FieldKind.JSON, json_shapes=("array",)),
        ),
    )
    good = {"note_id": "a", "at": 1.0, "text": "t", "tags": ["x", "y"]}
    records = loads_cut(orjson.dumps([good, {**good, "note_id": "b", "text": ["no"]}]), schema)
    assert type(records[0]["tags"]) is RawJson  # an array field is cut
    assert records[1]["text"] == ["no"]  # a field that cannot be an array is not
    with pytest.raises(RecordValidationError) as caught:
        validate_records(schema, records, "n")
    assert (caught.value.index, caught.value.field) == (1, "text")
    assert "expected JSON string or object" in str(caught.value)
    # a RawJson reaching a field whose shapes exclude arrays is refused by the same rule
    forged = [{**good, "text": RawJson('["no"]')}]
    with pytest.raises(RecordValidationError, match="expected JSON string or object"):
        validate_records(schema, forged, "n")


async def test_array_moves_round_trip_byte_identical(
    server: TestServer,
    session: aiohttp.ClientSession,
    peers: PeerClient,
    stores: RecordStores,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[type] = []

    def spy(schema: RecordSchema, records: Any, node_id: str) -> Any:
        seen.extend(type(record["moves"]) for record in records)
        return validate_records(schema, records, node_id)

    monkeypatch.setattr(routes_module, "validate_records", spy)
    records = [game(i, moves=MOVES) for i in range(300)] + [game(300, moves="e2e4 e7e5")]
    url = f"{base_url(server)}/v1/records/games"
    async with session.post(url, data=body_of(records)) as response:
        assert response.status == 200, await response.text()
        assert await response.json() == {"accepted": 301, "duplicates": 0}
    assert seen == [RawJson] * 300 + [str]  # the route never built the moves lists
    stored = stored_moves(stores["games"].path)
    assert stored["g-000000"] == MOVES_TEXT.decode()
    assert stored["g-000300"] == '"e2e4 e7e5"'
    async with session.get(f"{url}/since", params={"limit": "1000"}) as response:
        page = await response.read()
    assert page.count(b'"moves":' + MOVES_TEXT) == 300
    assert orjson.loads(page)["records"][0]["moves"] == MOVES
    fetched, _ = await fetch_page(peers, base_url(server), "games", None, 5, schema=GAMES_SCHEMA)
    assert fetched[0]["moves"] == RawJson(MOVES_TEXT.decode())
    async with RecordStore(tmp_path / "copy" / "games.db", GAMES_SCHEMA, SMALL) as copy:
        result = await pull_records(peers, base_url(server), "games", copy, limit=100)
        assert (result.pulled, result.inserted) == (301, 301)
    assert stored_moves(tmp_path / "copy" / "games.db") == stored


async def test_a_bad_record_beside_raw_arrays_refuses_the_whole_batch(
    server: TestServer, session: aiohttp.ClientSession, peers: PeerClient, stores: RecordStores
) -> None:
    records = [game(i, moves=MOVES) for i in range(10)]
    records[7]["moves"] = {"not": "an array"}
    url = f"{base_url(server)}/v1/records/games"
    async with session.post(url, data=body_of(records)) as response:
        answer = await response.json()
    assert response.status == 400
    assert (answer["index"], answer["field"]) == (7, "moves")
    assert stores["games"].status().count == 0


def test_a_value_equal_to_the_marker_is_not_taken_for_a_cut_value() -> None:
    forged = raw_module._cutter(GAMES_SCHEMA)
    assert forged is not None
    marker = forged.marks["moves"]
    records = [game(0, moves=marker), game(1, moves=["a"]), game(2, moves=marker)]
    parsed = loads_cut(body_of(records), GAMES_SCHEMA)
    assert [record["moves"] for record in parsed] == [marker, ["a"], marker]
    escaped_key = b'[{"a\\"moves":["x"]}]'
    assert loads_cut(escaped_key, GAMES_SCHEMA) == [{'a"moves': ["x"]}]


def test_pages_embed_the_stored_json_text_as_fragments() -> None:
    [row] = validate_records(GAMES_SCHEMA, [game(1, moves=MOVES)], "n")
    record = row_to_record(GAMES_SCHEMA, row, fragments=True)
    assert type(record["moves"]) is orjson.Fragment
    assert orjson.dumps(record) == orjson.dumps(row_to_record(GAMES_SCHEMA, row))


@pytest.mark.parametrize("moves", [[1, 2, 3], ["a", 1], [["a"], "b"], ["e\\2"], [], [""]])
def test_each_value_alone_is_cut_only_when_canonical(moves: list[Any]) -> None:
    records = [game(1, moves=moves), game(2, moves=["x", "y"])]
    parsed = loads_cut(orjson.dumps(records), GAMES_SCHEMA)
    canonical = all(type(move) is str and "\\" not in move for move in moves)
    expected = RawJson(orjson.dumps(moves).decode()) if canonical else moves
    assert parsed[0]["moves"] == expected
    assert parsed[1]["moves"] == RawJson('["x","y"]')
