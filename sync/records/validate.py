"""Pure validation of records against a RecordSchema, and the way back from a row to JSON.

A batch of plain values takes a column-at-a-time fast path; anything else, and every error,
goes through the exact record-at-a-time path, which alone decides what is valid.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

import orjson

from sync.errors import RecordValidationError, SyncError
from sync.records.raw import RawJson
from sync.records.schema import FieldKind, FieldSpec, RecordSchema

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_MISSING: Any = object()
_NONE = type(None)
_SHAPE_TYPES: dict[str, tuple[type, ...]] = {
    "array": (list,),
    "object": (dict,),
    "string": (str,),
    "number": (int, float),
    "boolean": (bool,),
}
_ANY_JSON: frozenset[type] = frozenset({dict, list, str, int, float, bool, _NONE})
_KIND_TYPES: dict[FieldKind, frozenset[type]] = {
    FieldKind.TEXT: frozenset({str}),
    FieldKind.INTEGER: frozenset({int}),
    FieldKind.REAL: frozenset({float, int}),
    FieldKind.BOOL: frozenset({bool}),
}

_Convert = Callable[[Any], Any]


def _dumps(value: Any) -> str:
    # orjson is several times faster than json; it refuses NaN, Infinity and non-str keys.
    return orjson.dumps(value).decode()


def _dumps_fast(value: Any) -> str:
    """_dumps(value), quicker for the common list of plain strings (moves); same text."""
    if type(value) is list and value:
        try:
            joined = "".join(value)
        except TypeError:
            return _dumps(value)
        if len(encode_basestring_ascii(joined)) == len(joined) + 2:  # nothing to escape
            return '["' + '","'.join(value) + '"]'
    return _dumps(value)


def _json_text(value: Any) -> Any:
    """The stored text of a json value on the fast path (None stays NULL)."""
    if value is None:
        return None
    if type(value) is RawJson:
        return value.text
    return _dumps_fast(value)


class _Invalid(SyncError):
    """Raised by a converter; the caller adds index and field."""


def _text(value: Any) -> Any:
    if type(value) is not str:
        raise _Invalid("expected string")
    if not value.isascii() and not _encodable(value):
        raise _Invalid("string is not valid unicode (lone surrogate)")
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _integer(value: Any) -> Any:
    if type(value) is not int:
        raise _Invalid("expected integer")
    if not _INT_MIN <= value <= _INT_MAX:
        raise _Invalid("integer out of the 64-bit range")
    return value


def _real(value: Any) -> Any:
    if type(value) is float:
        if not math.isfinite(value):
            raise _Invalid("expected a finite number")
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError as exc:
            raise _Invalid("number out of range") from exc
    raise _Invalid("expected number")


def _bool(value: Any) -> Any:
    if type(value) is not bool:
        raise _Invalid("expected boolean")
    return int(value)


def _json_converter(shapes: tuple[str, ...]) -> _Convert:
    expected = "expected JSON " + " or ".join(shapes)
    allowed = frozenset(t for shape in shapes for t in _SHAPE_TYPES[shape])

    def convert(value: Any) -> Any:
        if type(value) is RawJson:  # an array checked canonical by sync.records.raw
            if allowed and list not in allowed:
                raise _Invalid(expected)
            return value.text
        if allowed and type(value) not in allowed:
            raise _Invalid(expected)
        try:
            return _dumps(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise _Invalid("value is not JSON (or nests too deep)") from exc

    return convert


_CONVERTERS: dict[FieldKind, _Convert] = {
    FieldKind.TEXT: _text,
    FieldKind.INTEGER: _integer,
    FieldKind.REAL: _real,
    FieldKind.BOOL: _bool,
}


@functools.cache
def _plan(schema: RecordSchema) -> tuple[tuple[str, _Convert, FieldSpec, frozenset[type]], ...]:
    """Per field: name, converter, spec, and the Python types its fast path accepts."""
    plan = []
    for spec in schema.fields:
        types: frozenset[type]
        if spec.kind is FieldKind.JSON:
            convert = _json_converter(spec.json_shapes)
            types = frozenset(t for s in spec.json_shapes for t in _SHAPE_TYPES[s]) or _ANY_JSON
            if list in types:
                types |= {RawJson}
        else:
            convert = _CONVERTERS[spec.kind]
            types = _KIND_TYPES[spec.kind]
        if spec.nullable or not spec.required or spec.fill_node_id:
            types |= {_NONE}
        plan.append((spec.name, convert, spec, types))
    return tuple(plan)


def validate_records(
    schema: RecordSchema, records: Sequence[Any], node_id: str
) -> list[tuple[Any, ...]]:
    """Rows (values in field order) for `records`, or RecordValidationError for the first bad one.

    Unknown fields, missing required fields, null where not nullable and wrong kinds are errors
    (bool is not an integer; numbers must be finite; integers fit 64 bits). An absent or null
    optional field becomes NULL; a `fill_node_id` field absent or null becomes `node_id`; json
    fields become compact JSON text (a string stays a string: "abc" is stored as '"abc"').
    """
    if not isinstance(records, Sequence) or isinstance(records, str | bytes):
        raise RecordValidationError(None, "", "expected a JSON array of objects")
    rows = _fast_rows(schema, records, node_id)
    return rows if rows is not None else _exact_rows(schema, records, node_id)


def _fast_rows(
    schema: RecordSchema, records: Sequence[Any], node_id: str
) -> list[tuple[Any, ...]] | None:
    """The rows when every value is plain, column by column; None to leave it to _exact_rows."""
    if not records:
        return []
    known = frozenset(schema.columns)
    if set(map(type, records)) != {dict} or not all(map(known.issuperset, records)):
        return None
    columns = []
    try:
        for name, _, spec, allowed in _plan(schema):
            default = _MISSING if spec.required and not spec.fill_node_id else None
            values = [record.get(name, default) for record in records]
            types = set(map(type, values))
            if not types <= allowed:
                return None
            if _NONE in types and spec.fill_node_id:
                values = [node_id if value is None else value for value in values]
                types = (types - {_NONE}) | {str}
            if spec.kind is FieldKind.TEXT:
                texts = [v for v in values if v is not None] if _NONE in types else values
                if not all(map(str.isascii, texts)) and not all(map(_encodable, texts)):
                    return None
                if name == schema.key and (not all(texts) or "\x00" in "".join(texts)):
                    return None
            elif spec.kind is FieldKind.INTEGER:
                present = [value for value in values if value is not None]
                if present and not (min(present) >= _INT_MIN and max(present) <= _INT_MAX):
                    return None
            elif spec.kind is FieldKind.REAL:
                if int in types or _NONE in types:
                    values = [value if value is None else float(value) for value in values]
                if not all(math.isfinite(value) for value in values if value is not None):
                    return None
            elif spec.kind is FieldKind.BOOL:
                values = [value if value is None else int(value) for value in values]
            elif types == {RawJson}:
                values = [value.text for value in values]
            else:
                values = [_json_text(value) for value in values]
            columns.append(values)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return None
    return list(zip(*columns, strict=True))


def _exact_rows(
    schema: RecordSchema, records: Sequence[Any], node_id: str
) -> list[tuple[Any, ...]]:
    known = frozenset(schema.columns)
    rows: list[tuple[Any, ...]] = []
    for index, record in enumerate(records):
        if type(record) is not dict:
            raise RecordValidationError(index, "", "expected object")
        if not known.issuperset(record):
            unknown = sorted(str(name) for name in record if name not in known)
            raise RecordValidationError(index, unknown[0], "unknown field")
        row: list[Any] = []
        for name, convert, spec, _ in _plan(schema):
            value = record.get(name, _MISSING)
            if value is None or value is _MISSING:
                if spec.fill_node_id:
                    row.append(node_id)
                elif value is _MISSING and spec.required:
                    raise RecordValidationError(index, name, "required field missing")
                elif value is None and spec.required and not spec.nullable:
                    raise RecordValidationError(index, name, "must not be null")
                else:
                    row.append(None)
                continue
            try:
                row.append(convert(value))
                if name == schema.key:
                    _check_key(value)
            except _Invalid as exc:
                raise RecordValidationError(index, name, str(exc)) from None
        rows.append(tuple(row))
    return rows


def _check_key(value: Any) -> None:
    """A record key is a non-empty string without NUL (it names the record in URLs and logs)."""
    if value == "":
        raise _Invalid("the key must not be empty")
    if isinstance(value, str) and "\x00" in value:
        raise _Invalid("the key must not contain NUL")


def row_to_record(
    schema: RecordSchema, row: Sequence[Any], *, fragments: bool = False
) -> dict[str, Any]:
    """The JSON record of a row: json decoded, bools restored, absent optional fields left out.

    With `fragments`, json fields are orjson.Fragment of their stored text (already valid,
    canonical JSON): orjson.dumps embeds them without parsing or re-encoding.
    """
    record: dict[str, Any] = {}
    for spec, value in zip(schema.fields, row, strict=True):
        if value is None:
            if spec.required:
                record[spec.name] = None
            continue
        if spec.kind is FieldKind.JSON:
            value = orjson.Fragment(value) if fragments else orjson.loads(value)
        elif spec.kind is FieldKind.BOOL:
            value = bool(value)
        record[spec.name] = value
    return record
