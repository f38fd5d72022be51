"""Plain data and encoding: the JSON of payloads matches json.dumps, invalid values are refused."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

import wal.entry
from wal import EntryState, WalError
from wal.entry import as_payload, check_name, encode_json

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
def test_encoding_matches_compact_strict_json_dumps(value: Any) -> None:
    expected = json.dumps(value, separators=(",", ":"), allow_nan=False)
    assert encode_json(value, "payload") == expected
    assert json.loads(encode_json(value, "payload")) == json.loads(expected)


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
