"""Pure parts of the record stores: schemas, validation (fast and exact paths), since-queries."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from sync import (
    GAMES_SCHEMA,
    ROLLOUTS_SCHEMA,
    FieldKind,
    FieldSpec,
    RecordQueryError,
    RecordSchema,
    RecordSchemaError,
    RecordValidationError,
    SinceQuery,
    parse_since_query,
    row_to_record,
    schema_from_mapping,
    validate_records,
)
from sync.records.types import since_sql
from sync.records.validate import _exact_rows, _fast_rows
from tests.sync.record_fixtures import game, rollout


def error_of(records: list[Any], schema: RecordSchema = GAMES_SCHEMA) -> str:
    with pytest.raises(RecordValidationError) as info:
        validate_records(schema, records, "node-a")
    return str(info.value)


def test_valid_game_becomes_a_row_in_field_order_with_source_node_filled() -> None:
    [row] = validate_records(GAMES_SCHEMA, [game(1)], "node-a")
    assert row == (
        "g-000001",
        1_700_000_001.0,
        "hex8",
        2,
        1,
        '["m1","e2e4","e7e5"]',
        0.1,
        "node-a",
    )


def test_row_to_record_round_trips_and_leaves_absent_options_out() -> None:
    record = game(2, winner=None, moves="e2e4 e7e5")
    del record["quality"]
    [row] = validate_records(GAMES_SCHEMA, [record], "node-a")
    assert row[5] == '"e2e4 e7e5"'  # a string stays a string, stored as JSON text
    assert row_to_record(GAMES_SCHEMA, row) == {**record, "source_node": "node-a"}


@pytest.mark.parametrize(
    ("index", "field", "value", "message"),
    [
        (0, "num_players", "2", "expected integer"),
        (1, "num_players", True, "expected integer"),
        (1, "num_players", 2.0, "expected integer"),
        (2, "num_players", 2**63, "integer out of the 64-bit range"),
        (3, "created_at", "yesterday", "expected number"),
        (3, "created_at", math.nan, "expected a finite number"),
        (3, "created_at", math.inf, "expected a finite number"),
        (0, "created_at", 10**400, "number out of range"),
        (4, "board_type", 8, "expected string"),
        (4, "board_type", "\ud800", "string is not valid unicode (lone surrogate)"),
        (5, "moves", {"a": 1}, "expected JSON array or string"),
        (5, "moves", 3, "expected JSON array or string"),
        (6, "winner", "0", "expected integer"),
        (7, "num_players", None, "must not be null"),
        (2, "quality", False, "expected number"),
    ],
)
def test_invalid_field_is_named_with_its_record_index(
    index: int, field: str, value: Any, message: str
) -> None:
    records = [game(i) for i in range(8)]
    records[index][field] = value
    assert error_of(records) == f"records[{index}].{field}: {message}"


def test_the_error_names_the_first_bad_record_not_the_first_bad_field() -> None:
    records = [game(i) for i in range(30)]
    records[17]["num_players"] = "two"
    records[20]["created_at"] = "never"
    assert error_of(records) == "records[17].num_players: expected integer"


def test_unknown_missing_and_non_object_records() -> None:
    assert error_of([game(0), game(1), game(2), game(3, foo=1)]) == "records[3].foo: unknown field"
    missing = game(0)
    del missing["board_type"]
    assert error_of([missing]) == "records[0].board_type: required field missing"
    winnerless = game(0)
    del winnerless["winner"]  # nullable, yet required
    assert error_of([winnerless]) == "records[0].winner: required field missing"
    assert error_of([game(0), [1, 2]]) == "records[1]: expected object"
    assert error_of({"a": 1}) == "records: expected a JSON array of objects"  # type: ignore[arg-type]


def test_explicit_source_node_is_kept_and_null_is_filled() -> None:
    rows = validate_records(
        GAMES_SCHEMA, [game(0, source_node="origin"), game(1, source_node=None)], "me"
    )
    assert [row[-1] for row in rows] == ["origin", "me"]


def test_rollout_payload_is_any_json_including_null() -> None:
    records = [rollout(0), {**rollout(1), "payload": None}, {**rollout(2), "payload": "x"}]
    rows = validate_records(ROLLOUTS_SCHEMA, records, "n")
    assert [row[3] for row in rows] == ['{"obs":[0,1],"reward":0.5}', None, '"x"']
    assert row_to_record(ROLLOUTS_SCHEMA, rows[0]) == rollout(0)


RANDOM_VALUES = [
    *(None, True, 0, -(2**63), 2**63, 1.5, math.inf, "", "é", "\ud800", "x", [1], {"k": 2}),
    *(["a", "b"], ['q"', "b"], ["é"], [], ["a", 1], ["\n"], ["a", ["b"]], [math.nan]),
]


def _random_value(rng: random.Random) -> Any:
    return rng.choice(RANDOM_VALUES)


def test_fast_path_agrees_with_the_exact_path_on_random_batches() -> None:
    rng = random.Random(7)
    fast_hits = 0
    for _ in range(3000):
        records = [game(i) for i in range(rng.randint(1, 4))]
        for record in records:
            for _ in range(rng.randint(0, 2)):
                field = rng.choice([*GAMES_SCHEMA.columns, "extra"])
                if rng.random() < 0.2:
                    record.pop(field, None)
                else:
                    record[field] = _random_value(rng)
        fast = _fast_rows(GAMES_SCHEMA, records, "n")
        try:
            exact: Any = _exact_rows(GAMES_SCHEMA, records, "n")
        except RecordValidationError:
            exact = None
        if fast is not None:
            fast_hits += 1
            assert fast == exact, records
    assert fast_hits > 10


def test_schema_from_mapping_and_its_errors() -> None:
    schema = schema_from_mapping(
        "evals",
        {
            "key": "eval_id",
            "time_column": "at",
            "fields": {
                "eval_id": "integer",
                "at": "real",
                "passed": "bool",
                "notes": {"kind": "text", "required": False, "nullable": True},
            },
        },
    )
    assert schema.field("passed").kind is FieldKind.BOOL
    rows = validate_records(schema, [{"eval_id": 1, "at": 2, "passed": True}], "n")
    assert rows == [(1, 2.0, 1, None)]
    assert row_to_record(schema, rows[0]) == {"eval_id": 1, "at": 2.0, "passed": True}
    with pytest.raises(RecordSchemaError, match="kind must be one of"):
        schema_from_mapping("x", {"key": "a", "time_column": "t", "fields": {"a": "blob"}})
    with pytest.raises(RecordSchemaError, match="key 'b' is not a field"):
        schema_from_mapping("x", {"key": "b", "time_column": "t", "fields": {"t": "real"}})
    with pytest.raises(RecordSchemaError, match="must match"):
        RecordSchema("Bad-Name", "a", "t", (FieldSpec("a", FieldKind.TEXT),))
    with pytest.raises(RecordSchemaError, match="time_column 't' must be a required"):
        RecordSchema(
            "x",
            "a",
            "t",
            (FieldSpec("a", FieldKind.TEXT), FieldSpec("t", FieldKind.REAL, nullable=True)),
        )


def test_parse_since_query_and_filters() -> None:
    query = parse_since_query(
        GAMES_SCHEMA,
        {"ts": "12.5", "after": "g-1", "limit": "10", "min_quality": "0.5", "board_type": "hex8"},
    )
    assert query == SinceQuery(12.5, "g-1", 10, (("quality", 0.5),), (("board_type", "hex8"),))
    sql, params = since_sql(GAMES_SCHEMA, query)
    assert '("created_at", "game_id") > (?, ?)' in sql
    assert params == [12.5, "g-1", 0.5, "hex8", 10]
    assert parse_since_query(GAMES_SCHEMA, {}) == SinceQuery()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"ts": "soon"}, "ts: expected a number, got 'soon'"),
        ({"ts": "nan"}, "ts: expected a finite number"),
        ({"limit": "0"}, "limit: expected an integer 1-10000, got '0'"),
        ({"limit": "10001"}, "limit: expected an integer 1-10000, got '10001'"),
        ({"min_quality": "high"}, "min_quality: expected a number, got 'high'"),
        ({"color": "red"}, "color: unknown parameter"),
        ({"after": "g-1"}, "after: needs ts"),
        ({"num_players": "two"}, "num_players: expected an integer, got 'two'"),
    ],
)
def test_bad_since_query_names_the_parameter(query: dict[str, str], message: str) -> None:
    with pytest.raises(RecordQueryError) as info:
        parse_since_query(GAMES_SCHEMA, query)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "the key must not be empty"), ("g\x00-1", "the key must not contain NUL")],
)
@pytest.mark.parametrize("schema", [GAMES_SCHEMA, ROLLOUTS_SCHEMA])
def test_empty_keys_and_nul_in_keys_are_refused(
    key: str, message: str, schema: RecordSchema
) -> None:
    make = game if schema is GAMES_SCHEMA else rollout
    records = [make(1), make(2)]
    records[1][schema.key] = key
    assert error_of(records, schema) == f"records[1].{schema.key}: {message}"
