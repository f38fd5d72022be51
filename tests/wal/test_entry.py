"""Plain data and encoding: the JSON of payloads matches json.dumps, invalid values are refused."""

from __future__ import annotations

import datetime
import enum
import json
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

import wal.entry
from wal import EntryState, WalError
from wal.entry import as_payload, check_name, encode_json


@dataclass(frozen=True)
class Point:
    x: int


VALUES: list[Any] = [
    {"game_id": "g-1", "moves": 61},
    {"s": 'é\u2028\n"\\', "f": 1.5, "big": 10**30, "neg": -0.0, "tiny": 1e-300},
    {"nested": [1, None, True, False, {"x": [], "y": {}}], "1": "key"},
    {1: "int key", 2.5: "float key", None: "none key", False: "bool key"},
    [],
    "text",
    7,
    None,
]


@pytest.mark.parametrize("value", VALUES)
def test_encoding_is_compact_strict_json(value: Any) -> None:
    expected = json.dumps(value, separators=(",", ":"), allow_nan=False)
    text = encode_json(value, "payload")
    assert json.loads(text) == json.loads(expected)
    if text.isascii():  # orjson's text is json.dumps' but for unescaped non-ASCII characters
        assert text == expected


def test_text_beyond_ascii_is_written_as_it_is() -> None:
    assert encode_json({"s": "é\u2028"}, "payload") == '{"s":"é\u2028"}'


@pytest.mark.parametrize("nan", [float("nan"), float("inf"), -float("inf")])
def test_nan_is_refused_beside_a_null_and_alone(nan: float) -> None:
    """orjson writes NaN as null: text with a null goes to the strict encoder."""
    for value in ({"x": nan}, {"x": nan, "y": None}, [None, [nan]]):
        with pytest.raises(WalError, match="payload is not JSON-serialisable"):
            encode_json(value, "payload")


def test_enums_and_uuids_are_written_alike_beside_a_null_or_not() -> None:
    class Colour(enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    ident = uuid.UUID(int=7)
    for extra, null in ((None, "null"), (1, "1")):
        value = {"c": Colour.RED, "l": Level.HIGH, "u": ident, "n": extra}
        assert encode_json(value, "payload") == (f'{{"c":"red","l":3,"u":"{ident}","n":{null}}}')


@pytest.mark.parametrize("value", [{"d": datetime.date(2026, 1, 1)}, {"o": Point(1)}])
def test_dates_and_dataclasses_stay_refused(value: Any) -> None:
    with pytest.raises(WalError, match="payload is not JSON-serialisable"):
        encode_json(value, "payload")


@pytest.mark.parametrize(
    "value",
    [{"x": float("nan")}, {"x": float("inf")}, {"x": object()}, {"x": {1, 2}}, {(1, 2): 3}],
)
def test_values_that_are_not_json_are_refused(value: Any) -> None:
    with pytest.raises(WalError, match="payload is not JSON-serialisable"):
        encode_json(value, "payload")


def test_a_circular_payload_is_refused() -> None:
    circular: dict[str, Any] = {}
    circular["self"] = circular
    with pytest.raises(WalError, match="not JSON-serialisable"):
        encode_json(circular, "payload")


def test_payload_must_be_a_mapping_and_names_bounded() -> None:
    assert as_payload({"a": 1}) == {"a": 1}
    with pytest.raises(WalError, match="payload must be a mapping, not list"):
        as_payload([1])
    check_name("key", "k", 3)
    for bad in ("", "long", 5):
        with pytest.raises(WalError, match="key must be a non-empty string of at most 3"):
            check_name("key", bad, 3)  # type: ignore[arg-type]


def test_entry_states() -> None:
    assert not EntryState.PENDING.finished
    assert all(s.finished for s in EntryState if s is not EntryState.PENDING)
    assert EntryState("rolled_back") is EntryState.ROLLED_BACK


def test_the_fallback_encoder_gives_the_same_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "_json", None)
    fallback = wal.entry._json_encoder()
    for value in VALUES:
        assert fallback(value) == json.dumps(value, separators=(",", ":"), allow_nan=False)
