"""JSON-typed fields kept as raw JSON text from a request body to the row (and back).

Parsing a batch with orjson builds a Python object for every element of every array-valued json
field (a game's 120 moves), and storing it dumps them all again. Here the array values of a
schema's json fields are cut out of the body text before parsing when they are *canonical*: the
exact text `orjson.dumps(orjson.loads(text))` would give back, here a compact array of strings
without escapes or control characters (a game's moves). Such values are checked by a few byte
scans over all of them at once (canonical_strings says the rule for one), never parsed, and
stored as they came: the same text the object path stores, so both paths agree byte for byte.

Anything else (whitespace, escapes, numbers, objects, nesting) is left in the body and takes
the ordinary path. A value counts as cut out only if it lands, after parsing, on a json
field of a top-level record; otherwise the whole body is parsed again without cutting.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from sync.records.schema import FieldKind, RecordSchema

_CONTROLS = bytes(range(0x20))


def canonical_strings(span: bytes) -> bool:
    """Whether `span` is a compact JSON array of strings without escapes or control characters
    (so `orjson.dumps(orjson.loads(span)) == span`), checked without building its elements.

    Every quote inside must belong to a `","` separator (none is left once they are removed):
    then the text between separators holds no quote, so each is one string, and the span is
    exactly one array.
    """
    if span == b"[]":
        return True
    if len(span) < 4 or not span.startswith(b'["') or not span.endswith(b'"]'):
        return False
    rest = span[2:-2].replace(b'","', b"")
    if b'"' in rest or b"\\" in rest:
        return False
    return len(rest.translate(None, _CONTROLS)) == len(rest)


# A random marker per process: a client cannot send a string equal to it without knowing it.
_MARK = "shoal-raw-" + secrets.token_hex(16) + "-"


@dataclass(slots=True)  # not frozen: a frozen init costs a Python-level setattr per record
class RawJson:
    """The JSON text of an array-valued json field, checked canonical and never parsed."""

    text: str


@dataclass(frozen=True)
class _Cutter:
    keys: dict[str, bytes]
    marks: dict[str, str]


@functools.cache
def _cutter(schema: RecordSchema) -> _Cutter | None:
    names = [
        spec.name
        for spec in schema.fields
        if spec.kind is FieldKind.JSON and (not spec.json_shapes or "array" in spec.json_shapes)
    ]
    if not names:
        return None
    # Field names match NAME_PATTERN, so a key needs no escapes. A match may still not be the
    # key of a record (a nested object's key, `"a\\"moves":[` ...): _place finds out.
    keys = {name: f'"{name}":['.encode() for name in names}
    return _Cutter(keys, {name: f"{_MARK}{index}" for index, name in enumerate(names)})


def loads_cut(
    body: bytes, schema: RecordSchema, records_of: Callable[[Any], Any] = lambda doc: doc
) -> Any:
    """orjson.loads(body), with canonical array values of `schema`'s json fields as RawJson.

    `records_of` finds the list of records in the parsed document (the document itself for an
    ingest body, its "records" for a pull page). Raises what orjson.loads(body) raises.
    """
    cutter = _cutter(schema)
    if cutter is None:
        return orjson.loads(body)
    found = _candidates(body, cutter)
    if not found:
        return orjson.loads(body)
    if not _all_canonical(body, found):
        found = [item for item in found if canonical_strings(body[item[1] : item[2]])]
    pieces: list[bytes] = []
    cut: dict[str, list[bytes]] = {name: [] for name in cutter.marks}
    done = 0
    for name, start, end in found:
        pieces += (body[done:start], b'"', cutter.marks[name].encode(), b'"')
        cut[name].append(body[start:end])
        done = end
    if not pieces:
        return orjson.loads(body)
    pieces.append(body[done:])
    try:
        doc = orjson.loads(b"".join(pieces))
        if _place(records_of(doc), cut, cutter.marks):
            return doc
    except (ValueError, RecursionError):
        pass
    return orjson.loads(body)  # the error (or the document) of what the client sent


def _candidates(body: bytes, cutter: _Cutter) -> list[tuple[str, int, int]]:
    """(field, start, end) of each `"field":[...]` value, `...` up to the first `]`, in order,
    that starts with `["` and ends with `"]` (or is `[]`)."""
    starts: list[tuple[int, str]] = []
    for name, key in cutter.keys.items():
        at = body.find(key)
        while at >= 0:
            starts.append((at + len(key) - 1, name))
            at = body.find(key, at + len(key))
    if len(cutter.keys) > 1:
        starts.sort()
    found = []
    done = 0
    for start, name in starts:
        end = body.find(b"]", start) + 1
        if start < done or end == 0:
            continue
        if end - start == 2 or (end - start >= 4 and body[start + 1] == body[end - 2] == 0x22):
            found.append((name, start, end))
            done = end
    return found


def _all_canonical(body: bytes, found: list[tuple[str, int, int]]) -> bool:
    """canonical_strings of every candidate, checked at once: their insides joined by NUL (which
    no canonical inside holds, and which no `","` can straddle) have no quote outside a `","`,
    no backslash and no control character but the NULs."""
    joined = b"\x00".join([body[start + 2 : end - 2] for _, start, end in found if end - start > 2])
    rest = joined.replace(b'","', b"")
    if b'"' in rest or b"\\" in rest:
        return False
    return len(rest.translate(None, _CONTROLS)) == len(rest) - rest.count(b"\x00")


def _place(records: Any, cut: dict[str, list[bytes]], marks: dict[str, str]) -> bool:
    """Replace each marker of a top-level record by its RawJson; False unless every cut value
    was found exactly there (a marker elsewhere means the cut went somewhere unexpected).
    Raises UnicodeDecodeError (a ValueError) for a cut value that is not UTF-8."""
    if type(records) is not list:
        return False
    for name, spans in cut.items():
        if not spans:
            continue
        mark = marks[name]
        found = 0
        for record in records:
            if type(record) is dict and record.get(name) == mark:
                if found == len(spans):
                    return False
                record[name] = RawJson(spans[found].decode())
                found += 1
        if found != len(spans):
            return False
    return True
