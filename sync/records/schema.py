"""Record store schemas (declared once, built-ins here) and the pure validation of records.

A valid record becomes a row tuple in field order; `row_to_record` turns a row back into JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sync.errors import RecordSchemaError

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class FieldKind(StrEnum):
    """How a field is checked and stored: bool is stored as 0/1 and is never an integer."""

    TEXT = "text"
    INTEGER = "integer"
    REAL = "real"
    JSON = "json"
    BOOL = "bool"


_SQL_TYPES = {
    FieldKind.TEXT: "TEXT",
    FieldKind.INTEGER: "INTEGER",
    FieldKind.REAL: "REAL",
    FieldKind.JSON: "TEXT",
    FieldKind.BOOL: "INTEGER",
}
_JSON_SHAPES = frozenset({"array", "object", "string", "number", "boolean"})


@dataclass(frozen=True)
class FieldSpec:
    """One field of a record.

    `json_shapes` limits a json field to some of array, object, string, number, boolean.
    `fill_node_id` fills an absent or null value with the receiving node's id.
    """

    name: str
    kind: FieldKind
    required: bool = True
    nullable: bool = False
    json_shapes: tuple[str, ...] = ()
    fill_node_id: bool = False


@dataclass(frozen=True)
class RecordSchema:
    """A record store: its name, primary key, time column (the pull order) and fields."""

    name: str
    key: str
    time_column: str
    fields: tuple[FieldSpec, ...]

    def __post_init__(self) -> None:
        check_schema(self)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.fields)

    def field(self, name: str) -> FieldSpec:
        for spec in self.fields:
            if spec.name == name:
                return spec
        raise RecordSchemaError(f"store {self.name!r} has no field {name!r}")


def check_schema(schema: RecordSchema) -> None:
    """Raise RecordSchemaError unless names are safe SQL identifiers and key/time are usable."""
    where = f"record store {schema.name!r}"
    if not NAME_PATTERN.match(schema.name):
        raise RecordSchemaError(f"{where}: name must match {NAME_PATTERN.pattern}")
    names = [spec.name for spec in schema.fields]
    for spec in schema.fields:
        if not NAME_PATTERN.match(spec.name):
            raise RecordSchemaError(
                f"{where}: field {spec.name!r} must match {NAME_PATTERN.pattern}"
            )
        if names.count(spec.name) > 1:
            raise RecordSchemaError(f"{where}: field {spec.name!r} is declared twice")
        bad_shapes = set(spec.json_shapes) - set(_JSON_SHAPES)
        if bad_shapes or (spec.json_shapes and spec.kind is not FieldKind.JSON):
            raise RecordSchemaError(f"{where}: field {spec.name!r} has bad json_shapes")
        if spec.fill_node_id and spec.kind is not FieldKind.TEXT:
            raise RecordSchemaError(f"{where}: only a text field can be filled with the node id")
    for role, name, kinds in (
        ("key", schema.key, (FieldKind.TEXT, FieldKind.INTEGER)),
        ("time_column", schema.time_column, (FieldKind.REAL, FieldKind.INTEGER)),
    ):
        if name not in names:
            raise RecordSchemaError(f"{where}: {role} {name!r} is not a field")
        spec = schema.fields[names.index(name)]
        if spec.kind not in kinds or not spec.required or spec.nullable:
            raise RecordSchemaError(
                f"{where}: {role} {name!r} must be a required, non-null {' or '.join(kinds)} field"
            )
    if schema.key == schema.time_column:
        raise RecordSchemaError(f"{where}: key and time_column must differ")


GAMES_SCHEMA = RecordSchema(
    name="games",
    key="game_id",
    time_column="created_at",
    fields=(
        FieldSpec("game_id", FieldKind.TEXT),
        FieldSpec("created_at", FieldKind.REAL),
        FieldSpec("board_type", FieldKind.TEXT),
        FieldSpec("num_players", FieldKind.INTEGER),
        FieldSpec("winner", FieldKind.INTEGER, nullable=True),
        FieldSpec("moves", FieldKind.JSON, json_shapes=("array", "string")),
        FieldSpec("quality", FieldKind.REAL, required=False, nullable=True),
        FieldSpec("source_node", FieldKind.TEXT, required=False, fill_node_id=True),
    ),
)
ROLLOUTS_SCHEMA = RecordSchema(
    name="rollouts",
    key="sample_id",
    time_column="created_at",
    fields=(
        FieldSpec("sample_id", FieldKind.TEXT),
        FieldSpec("created_at", FieldKind.REAL),
        FieldSpec("model_version", FieldKind.INTEGER),
        FieldSpec("payload", FieldKind.JSON, nullable=True),
        FieldSpec("run", FieldKind.TEXT, required=False, nullable=True),
    ),
)
BUILTIN_SCHEMAS: Mapping[str, RecordSchema] = {
    schema.name: schema for schema in (GAMES_SCHEMA, ROLLOUTS_SCHEMA)
}


def schema_from_mapping(name: str, data: Mapping[str, object]) -> RecordSchema:
    """A schema from configuration: {key, time_column, fields: {name: kind | {kind, ...}}}."""
    where = f"record store {name!r}"
    fields_data = data.get("fields")
    if not isinstance(fields_data, Mapping) or not fields_data:
        raise RecordSchemaError(f"{where}: fields must be a non-empty mapping of name to kind")
    unknown = set(data) - {"key", "time_column", "fields"}
    if unknown:
        raise RecordSchemaError(f"{where}: unknown keys {sorted(unknown)}")
    specs = []
    for field_name, raw in fields_data.items():
        options = {"kind": raw} if isinstance(raw, str) else raw
        if not isinstance(options, Mapping):
            raise RecordSchemaError(f"{where}: field {field_name!r} must be a kind or a mapping")
        extra = set(options) - {"kind", "required", "nullable", "json_shapes"}
        if extra:
            raise RecordSchemaError(
                f"{where}: field {field_name!r} has unknown keys {sorted(extra)}"
            )
        try:
            kind = FieldKind(str(options.get("kind")))
        except ValueError as exc:
            raise RecordSchemaError(
                f"{where}: field {field_name!r} kind must be one of "
                f"{', '.join(k.value for k in FieldKind)}"
            ) from exc
        specs.append(
            FieldSpec(
                name=str(field_name),
                kind=kind,
                required=bool(options.get("required", True)),
                nullable=bool(options.get("nullable", False)),
                json_shapes=tuple(options.get("json_shapes", ())),
            )
        )
    return RecordSchema(
        name=name,
        key=str(data.get("key", "")),
        time_column=str(data.get("time_column", "")),
        fields=tuple(specs),
    )


# --- SQL -------------------------------------------------------------------------------------


def _quoted(name: str) -> str:
    return f'"{name}"'


def sql_type(kind: FieldKind) -> str:
    """The declared SQLite type of a field of `kind`."""
    return _SQL_TYPES[kind]


def create_table_sql(schema: RecordSchema) -> list[str]:
    """Statements that create the store's STRICT table and its (time, key) index if absent."""
    columns = []
    for spec in schema.fields:
        column = f"{_quoted(spec.name)} {_SQL_TYPES[spec.kind]}"
        if spec.name == schema.key:
            column += " NOT NULL PRIMARY KEY"
        elif spec.required and not spec.nullable:
            column += " NOT NULL"
        columns.append(column)
    table = _quoted(schema.name)
    index = _quoted(f"{schema.name}_by_time")
    return [
        f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(columns)}) STRICT",
        f"CREATE INDEX IF NOT EXISTS {index} ON {table} "
        f"({_quoted(schema.time_column)}, {_quoted(schema.key)})",
    ]


def insert_sql(schema: RecordSchema) -> str:
    names = ", ".join(_quoted(name) for name in schema.columns)
    marks = ", ".join("?" for _ in schema.fields)
    # Identifiers are checked against NAME_PATTERN by check_schema; values are bound.
    return f"INSERT OR IGNORE INTO {_quoted(schema.name)} ({names}) VALUES ({marks})"  # noqa: S608


def select_sql(schema: RecordSchema) -> str:
    names = ", ".join(_quoted(name) for name in schema.columns)
    return f"SELECT {names} FROM {_quoted(schema.name)}"  # noqa: S608


# --- JSON Schema -----------------------------------------------------------------------------

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_FLOAT_MAX = 1.7976931348623157e308
JSON_VALUE_DEF = "JsonValue"
_JSON_REF = {"$ref": f"#/$defs/{JSON_VALUE_DEF}"}
_NUMBER = {"type": "number", "minimum": -_FLOAT_MAX, "maximum": _FLOAT_MAX}
_INTEGER = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
_SHAPE_SCHEMAS: dict[str, dict[str, Any]] = {
    "array": {"type": "array", "items": _JSON_REF},
    # schema literal: a json field's shape, declared per field in a store's config (no model)
    "object": {"type": "object", "additionalProperties": _JSON_REF},
    "string": {"type": "string"},
    # a JSON number the stores keep: a 64-bit integer or a finite float
    "number": {"anyOf": [_INTEGER, _NUMBER]},
    "boolean": {"type": "boolean"},
}
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "description": "Any JSON value whose integers fit 64 bits",
    "anyOf": [{"type": "null"}, *_SHAPE_SCHEMAS.values()],
}
"""A value a json field stores (orjson refuses integers beyond 64 bits)."""


def _field_json_schema(schema: RecordSchema, spec: FieldSpec) -> dict[str, Any]:
    if spec.kind is FieldKind.TEXT:
        value: dict[str, Any] = {"type": "string"}
        if spec.name == schema.key:
            # the key names the record in URLs and logs: non-empty, no NUL (validate._check_key)
            value |= {"minLength": 1, "pattern": "^[^\\u0000]*$"}
    elif spec.kind is FieldKind.INTEGER:
        value = dict(_INTEGER)
    elif spec.kind is FieldKind.REAL:
        value = dict(_NUMBER)
    elif spec.kind is FieldKind.BOOL:
        value = {"type": "boolean"}
    elif spec.json_shapes:
        value = {"anyOf": [_SHAPE_SCHEMAS[shape] for shape in spec.json_shapes]}
    else:
        value = dict(_JSON_REF)
    if spec.nullable or not spec.required or spec.fill_node_id:
        value = {"anyOf": [value, {"type": "null"}]}
    if spec.fill_node_id:
        value["description"] = "absent or null: the receiving node's id"
    return value


def record_json_schema(schema: RecordSchema) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one record of `schema`: exactly what
    validate_records accepts. Json fields refer to `#/$defs/JsonValue`, given in `$defs`."""
    required = [spec.name for spec in schema.fields if spec.required and not spec.fill_node_id]
    return {
        "title": f"{schema.name} record",
        # schema literal: a record store is declared in config, not by a model; this is built
        # from that declaration, field by field, exactly as validate_records checks it
        "type": "object",
        "properties": {spec.name: _field_json_schema(schema, spec) for spec in schema.fields},
        "required": required,
        "additionalProperties": False,
        "$defs": {JSON_VALUE_DEF: JSON_VALUE_SCHEMA},
    }
