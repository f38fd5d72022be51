"""The record routes' operations as each store spells them out: one per store, its body,
records and filters built from its RecordSchema (a store is declared in config, so its records'
JSON Schema is generated from that declaration), and the answers' models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, Field

from config.declare import Refusal, Route
from sync.records.schema import (
    INT64_MAX,
    INT64_MIN,
    FieldKind,
    RecordSchema,
    record_json_schema,
)
from sync.records.types import DEFAULT_PAGE_LIMIT, MAX_GET_KEYS, MAX_PAGE_LIMIT

PREFIX = "/v1/records"
BAD_QUERY = Refusal(400, "bad_query", "bad query, naming the parameter")


class IngestAnswer(BaseModel):
    """What an ingest answers once durable."""

    accepted: int = Field(ge=0)
    duplicates: int = Field(ge=0)


class StoreStatusAnswer(BaseModel):
    """The status of one record store."""

    store: str
    count: int = Field(ge=0)
    newest_created_at: float | None = None
    size_bytes: int | None = None


class StoresStatus(BaseModel):
    """The status of every record store."""

    stores: list[StoreStatusAnswer]


_NUM = {"type": "number"}


def per_store(
    doc: Callable[[Route, RecordSchema], Route],
) -> Callable[[Any, Route], list[Route]]:
    """A route's `each`: `doc` of it for every store its handlers serve (their `schemas()`)."""
    return lambda handlers, found: [doc(found, schema) for schema in handlers.schemas()]


def _records(schema: RecordSchema) -> dict[str, Any]:
    return {"type": "array", "items": record_json_schema(schema)}


class SincePage(BaseModel):
    """A page of a store's records after a cursor."""

    records: list[dict[str, Any]]
    next: dict[str, Any] | None


class Found(BaseModel):
    """A store's records by key, and the keys it does not hold."""

    records: list[dict[str, Any]]
    missing: list[Any]


def _answer_of(model: type[BaseModel], schema: RecordSchema) -> dict[str, Any]:
    """`model`'s JSON Schema with its records of `schema` (built from the store's
    declaration)."""
    generated = model.model_json_schema()
    generated["properties"]["records"] = _records(schema)
    return generated


def ingest_doc(found: Route, schema: RecordSchema, max_records: int, gated: bool) -> Route:
    """The POST of one store: its records' schema, at most `max_records`; `gated`: it may
    answer 429 (its IngestGate's BacklogFullError)."""
    backlog = Refusal(
        429,
        "too_many_pending",
        "too many unconsumed records (of a run); nothing written; see Retry-After",
    )
    return replace(
        found,
        path=f"{PREFIX}/{schema.name}",
        summary=f"Ingest a JSON array (or NDJSON, one record per line) of {schema.name} "
        "records; answered once durable",
        params=(),
        answers=((200, '{"accepted": N, "duplicates": M}'),),
        errors=(
            Refusal(400, "invalid_record", "invalid record or malformed JSON; nothing written"),
            Refusal(413, "too_large", "too many records or too large a body"),
            *((backlog,) if gated else ()),
            Refusal(503, "busy", "queue full or store unavailable; see Retry-After"),
            Refusal(
                507,
                "insufficient_storage",
                "disk full: nothing written; path and free_bytes name the disk",
            ),
        ),
        body={**_records(schema), "maxItems": max_records},
        body_types=("application/json", "application/x-ndjson"),
        answer=IngestAnswer,
    )


def status_doc(found: Route, schema: RecordSchema) -> Route:
    return replace(
        found,
        path=f"{PREFIX}/{schema.name}/status",
        summary=f"count, newest_created_at and size_bytes of {schema.name}",
        params=(),
        errors=(),
    )


def _key_schema(schema: RecordSchema) -> dict[str, Any]:
    if schema.field(schema.key).kind is FieldKind.INTEGER:
        return {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
    return {"type": "string"}


def _filter_parameters(schema: RecordSchema) -> list[tuple[str, str, str, Any]]:
    """The filters of GET .../since for `schema` (what parse_since_query takes): min_<number
    field> and equality on a text or integer field."""
    filters: list[tuple[str, str, str, Any]] = []
    for spec in schema.fields:
        if spec.kind in (FieldKind.REAL, FieldKind.INTEGER):
            filters.append((f"min_{spec.name}", "query", f"{spec.name} >= this", _NUM))
        if spec.kind is FieldKind.TEXT:
            filters.append((spec.name, "query", f"{spec.name} equals this", {"type": "string"}))
        elif spec.kind is FieldKind.INTEGER:
            kind = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
            filters.append((spec.name, "query", f"{spec.name} equals this", kind))
    return filters


def since_doc(found: Route, schema: RecordSchema) -> Route:
    page_limit = {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LIMIT}
    key = _key_schema(schema)
    return replace(
        found,
        path=f"{PREFIX}/{schema.name}/since",
        summary=f"{schema.name} records after (ts, after) in ({schema.time_column}, "
        f"{schema.key}) order, with the next cursor",
        answers=((200, '{"records": [...], "next": {"ts", "after"} | null}'),),
        errors=(BAD_QUERY,),
        params=(
            ("ts", "query", "Time bound; without `after`, records with time >= ts", _NUM),
            ("after", "query", "Key bound: records with (time, key) > (ts, after); needs ts", key),
            ("limit", "query", f"Page size (default {DEFAULT_PAGE_LIMIT})", page_limit),
            *_filter_parameters(schema),
        ),
        answer=_answer_of(SincePage, schema),
    )


def get_doc(found: Route, schema: RecordSchema) -> Route:
    keys = {"type": "array", "items": _key_schema(schema), "minItems": 1}
    return replace(
        found,
        path=f"{PREFIX}/{schema.name}/get",
        summary=f"{schema.name} records by key: ?key=a&key=b; absent ones in missing",
        answers=((200, '{"records": [...], "missing": [...]}'),),
        errors=(BAD_QUERY,),
        params=(
            (
                "key",
                "query",
                "A record key; repeat for more",
                keys | {"maxItems": MAX_GET_KEYS, "x-required": True},
            ),
        ),
        answer=_answer_of(Found, schema),
    )
