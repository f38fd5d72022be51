"""HTTP routes of the record stores: ingest (JSON or NDJSON), status, since-pages and lookups.

Every refusal is JSON `{"error": code, "reason": text, "status": N}` (config.wire); client input
never causes a 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import orjson
from aiohttp import web

from config import error_response as error_answer
from sync.errors import (
    BacklogFullError,
    RecordQueryError,
    RecordValidationError,
    StoreBusyError,
    StoreClosedError,
    StoreFullError,
    StoreWriteError,
    SyncError,
    UnknownStoreError,
)
from sync.records.raw import loads_cut
from sync.records.schema import (
    BUILTIN_SCHEMAS,
    INT64_MAX,
    INT64_MIN,
    FieldKind,
    RecordSchema,
    record_json_schema,
)
from sync.records.sqlite import Row
from sync.records.store import RecordStore
from sync.records.types import (
    DEFAULT_PAGE_LIMIT,
    MAX_GET_KEYS,
    MAX_PAGE_LIMIT,
    IngestResult,
    parse_get_keys,
    parse_since_query,
)
from sync.records.validate import validate_records

DEFAULT_MAX_RECORDS = 10_000
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
NDJSON_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/x-jsonlines"})
PREFIX = "/v1/records"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class IngestGate(Protocol):
    """Admission of validated rows before they are written, e.g. a cap on unconsumed records.

    `reserve` raises a SyncError to refuse (BacklogFullError: 429), else returns a ticket and
    the rows to write (it may set server-side fields); no await lies between its return and
    the rows' place in the store's queue. `settle` gets the ticket back with the ingest's
    result, or None when it failed.
    """

    async def reserve(
        self, store: RecordStore, rows: Sequence[Row]
    ) -> tuple[object, Sequence[Row]]: ...

    def settle(self, store: RecordStore, ticket: object, result: IngestResult | None) -> None: ...


def _dumps_text(value: Any) -> str:
    return orjson.dumps(value).decode()


def _loads(text: str) -> Any:
    # orjson parses several times faster than json and refuses NaN and Infinity itself.
    return orjson.loads(text)


def parse_body(body: bytes, ndjson: bool, schema: RecordSchema | None = None) -> list[Any]:
    """The records of a request body: a JSON array, or one JSON value per non-empty line.

    With `schema`, canonical array values of its json fields in a JSON array body stay raw text
    (sync.records.raw). Raises RecordValidationError (index None for the whole body, else the
    NDJSON record).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordValidationError(None, "", f"body is not UTF-8: {exc.reason}") from None
    if not ndjson:
        try:
            records = _loads(text) if schema is None else loads_cut(body, schema)
        except (ValueError, RecursionError) as exc:
            raise RecordValidationError(None, "", f"malformed JSON: {exc}") from None
        if not isinstance(records, list):
            raise RecordValidationError(None, "", "expected a JSON array of objects")
        return records
    records = []
    # split on "\n" only: U+2028 and friends may stand unescaped inside JSON strings
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append(_loads(line))
        except (ValueError, RecursionError) as exc:
            raise RecordValidationError(
                len(records), "", f"malformed JSON on line {number}: {exc}"
            ) from None
    return records


def _refusal(status: int, code: str, reason: str, **extra: Any) -> web.Response:
    return error_answer(status, reason, code, **extra)


def error_response(exc: SyncError) -> web.Response:
    """The HTTP answer to a SyncError met while serving a record request."""
    if isinstance(exc, RecordValidationError):
        return _refusal(400, "invalid_record", str(exc), index=exc.index, field=exc.field or None)
    if isinstance(exc, RecordQueryError):
        return _refusal(400, "bad_query", str(exc), param=exc.param)
    if isinstance(exc, UnknownStoreError):
        return _refusal(404, "unknown_store", str(exc))
    if isinstance(exc, StoreFullError):
        return _refusal(
            507, "insufficient_storage", str(exc), path=str(exc.path), free_bytes=exc.free_bytes
        )
    if isinstance(exc, BacklogFullError):
        return _refusal(429, "too_many_pending", str(exc), retry_after_s=exc.retry_after_s)
    if isinstance(exc, StoreBusyError):
        return _refusal(503, "busy", str(exc), retry_after_s=exc.retry_after_s)
    if isinstance(exc, StoreClosedError | StoreWriteError):
        return _refusal(503, "unavailable", str(exc), retry_after_s=1.0)
    return _refusal(500, "sync_error", str(exc))


def _guarded(fn: Handler) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except SyncError as exc:
            return error_response(exc)

    return handler


async def read_body(request: web.Request, max_bytes: int) -> bytes | None:
    """The request body, or None when it exceeds `max_bytes`.

    Streams it, so the app's client_max_size does not apply; a body a middleware already read
    (e.g. to check a signature) is taken from aiohttp's cache.
    """
    if request.content_length is not None and request.content_length > max_bytes:
        return None
    if request.content.at_eof():
        cached = await request.read()
        return cached if len(cached) <= max_bytes else None
    data = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > max_bytes:
            return None
    return bytes(data)


def record_routes(
    stores: Mapping[str, RecordStore],
    node_id: str,
    max_records: int = DEFAULT_MAX_RECORDS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    on_ingest: Callable[[str, int, int], None] | None = None,
    gate: IngestGate | None = None,
) -> list[web.RouteDef]:
    """Routes under /v1/records serving `stores` (looked up per request, so a RecordStores that
    opens later works); `node_id` fills a record's absent source node; `on_ingest(store,
    accepted, duplicates)` hears of every durable ingest (the node's metrics); `gate` admits
    (or refuses) every POSTed request's rows before they are written.
    """
    handlers = _RecordHandlers(stores, node_id, max_records, max_body_bytes, on_ingest, gate)
    return [
        web.get(PREFIX, _guarded(handlers.all_status)),
        web.post(PREFIX + "/{store}", _guarded(handlers.ingest)),
        web.get(PREFIX + "/{store}/status", _guarded(handlers.status)),
        web.get(PREFIX + "/{store}/since", _guarded(handlers.since)),
        web.get(PREFIX + "/{store}/get", _guarded(handlers.get)),
    ]


class _RecordHandlers:
    """The handlers of record_routes; one method per route."""

    def __init__(
        self,
        stores: Mapping[str, RecordStore],
        node_id: str,
        max_records: int,
        max_body_bytes: int,
        on_ingest: Callable[[str, int, int], None] | None,
        gate: IngestGate | None,
    ) -> None:
        self._stores = stores
        self._node_id = node_id
        self._max_records = max_records
        self._max_body_bytes = max_body_bytes
        self._on_ingest = on_ingest
        self._gate = gate

    def store_of(self, request: web.Request) -> RecordStore:
        name = request.match_info["store"]
        store = self._stores.get(name)
        if store is None:
            raise UnknownStoreError(name)
        return store

    async def ingest(self, request: web.Request) -> web.StreamResponse:
        store = self.store_of(request)
        body = await read_body(request, self._max_body_bytes)
        if body is None:
            return _refusal(413, "too_large", f"request body exceeds {self._max_body_bytes} bytes")
        records = parse_body(body, request.content_type in NDJSON_TYPES, store.schema)
        if len(records) > self._max_records:
            return _refusal(
                413,
                "too_many_records",
                f"{len(records)} records in one request; at most {self._max_records} are accepted",
            )
        rows: Sequence[Row] = validate_records(store.schema, records, self._node_id)
        if self._gate is None:
            result = await store.ingest_rows(rows)
        else:
            ticket, rows = await self._gate.reserve(store, rows)
            try:
                result = await store.ingest_rows(rows)
            except BaseException:
                self._gate.settle(store, ticket, None)
                raise
            self._gate.settle(store, ticket, result)
        if self._on_ingest is not None:
            self._on_ingest(store.schema.name, result.accepted, result.duplicates)
        return web.json_response(result.to_json())

    async def status(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.store_of(request).status().to_json())

    async def all_status(self, request: web.Request) -> web.StreamResponse:
        statuses = [self._stores[name].status().to_json() for name in sorted(self._stores)]
        return web.json_response({"stores": statuses})

    async def since(self, request: web.Request) -> web.StreamResponse:
        store = self.store_of(request)
        query = parse_since_query(store.schema, request.query, MAX_PAGE_LIMIT)
        body = await store.since_json(query)
        return web.Response(body=body, content_type="application/json")

    async def get(self, request: web.Request) -> web.StreamResponse:
        store = self.store_of(request)
        keys = parse_get_keys(store.schema, request.query.getall("key", []))
        extra = set(request.query) - {"key"}
        if extra:
            raise RecordQueryError(sorted(extra)[0], "unknown parameter")
        records = await store.get(keys)
        found = {record[store.schema.key] for record in records}
        missing = [key for key in dict.fromkeys(keys) if key not in found]
        return web.json_response({"records": records, "missing": missing}, dumps=_dumps_text)


_INGEST_RESULT = {
    "type": "object",
    "required": ["accepted", "duplicates"],
    "properties": {
        "accepted": {"type": "integer", "minimum": 0},
        "duplicates": {"type": "integer", "minimum": 0},
    },
}
_STORE_STATUS = {
    "type": "object",
    "required": ["store", "count"],
    "properties": {
        "store": {"type": "string"},
        "count": {"type": "integer", "minimum": 0},
        "newest_created_at": {"type": ["number", "null"]},
        "size_bytes": {"type": ["integer", "null"]},
    },
}


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


_NUM = {"type": "number"}


def record_route_docs(
    schemas: Sequence[RecordSchema] = tuple(BUILTIN_SCHEMAS.values()),
    max_records: int = DEFAULT_MAX_RECORDS,
    gated: Collection[str] = (),
) -> list[dict[str, Any]]:
    """OpenAPI notes of the record routes, as keyword arguments of node's RouteDoc: one set of
    paths per store of `schemas` (each its own body, records and filters, from its RecordSchema
    as JSON Schema); any other store name answers 404 unknown_store. The POST of a store named
    in `gated` may answer 429 (its IngestGate's BacklogFullError)."""
    docs: list[dict[str, Any]] = [
        {
            "method": "GET",
            "path": PREFIX,
            "summary": "Status of every record store",
            "response": {
                "type": "object",
                "required": ["stores"],
                "properties": {"stores": {"type": "array", "items": _STORE_STATUS}},
            },
        }
    ]
    for schema in sorted(schemas, key=lambda s: s.name):
        docs.extend(_store_docs(schema, max_records, schema.name in gated))
    return docs


_BACKLOG_FULL = (429, "too many unconsumed records (of a run); nothing written; see Retry-After")


def _store_docs(schema: RecordSchema, max_records: int, gated: bool) -> list[dict[str, Any]]:
    records = {"type": "array", "items": record_json_schema(schema)}
    key_kind = schema.field(schema.key).kind
    key: dict[str, Any] = (
        {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
        if key_kind is FieldKind.INTEGER
        else {"type": "string"}
    )
    return [
        _ingest_doc(schema, records, max_records, gated),
        {
            "method": "GET",
            "path": f"{PREFIX}/{schema.name}/status",
            "summary": f"count, newest_created_at and size_bytes of {schema.name}",
            "response": _STORE_STATUS,
        },
        _since_doc(schema, records, key),
        _get_doc(schema, records, key),
    ]


_BAD_QUERY = (400, "bad query, naming the parameter")


def _ingest_doc(
    schema: RecordSchema, records: dict[str, Any], max_records: int, gated: bool
) -> dict[str, Any]:
    return {
        "method": "POST",
        "path": f"{PREFIX}/{schema.name}",
        "summary": f"Ingest a JSON array (or NDJSON, one record per line) of {schema.name} "
        "records; answered once durable",
        "responses": (
            (200, '{"accepted": N, "duplicates": M}'),
            (400, "invalid record or malformed JSON; nothing written"),
            (413, "too many records or too large a body"),
            *((_BACKLOG_FULL,) if gated else ()),
            (503, "queue full or store unavailable; see Retry-After"),
            (507, "disk full: nothing written; path and free_bytes name the disk"),
        ),
        "body": {**records, "maxItems": max_records},
        "body_types": ("application/json", "application/x-ndjson"),
        "response": _INGEST_RESULT,
    }


def _since_doc(
    schema: RecordSchema, records: dict[str, Any], key: dict[str, Any]
) -> dict[str, Any]:
    page_limit = {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LIMIT}
    return {
        "method": "GET",
        "path": f"{PREFIX}/{schema.name}/since",
        "summary": f"{schema.name} records after (ts, after) in ({schema.time_column}, "
        f"{schema.key}) order, with the next cursor",
        "responses": ((200, '{"records": [...], "next": {"ts", "after"} | null}'), _BAD_QUERY),
        "parameters": (
            ("ts", "query", "Time bound; without `after`, records with time >= ts", _NUM),
            ("after", "query", "Key bound: records with (time, key) > (ts, after); needs ts", key),
            ("limit", "query", f"Page size (default {DEFAULT_PAGE_LIMIT})", page_limit),
            *_filter_parameters(schema),
        ),
        "response": {
            "type": "object",
            "required": ["records", "next"],
            "properties": {"records": records, "next": {"type": ["object", "null"]}},
        },
    }


def _get_doc(schema: RecordSchema, records: dict[str, Any], key: dict[str, Any]) -> dict[str, Any]:
    return {
        "method": "GET",
        "path": f"{PREFIX}/{schema.name}/get",
        "summary": f"{schema.name} records by key: ?key=a&key=b; absent ones in missing",
        "responses": ((200, '{"records": [...], "missing": [...]}'), _BAD_QUERY),
        "parameters": (
            (
                "key",
                "query",
                "A record key; repeat for more",
                {"type": "array", "items": key, "minItems": 1, "maxItems": MAX_GET_KEYS}
                | {"x-required": True},
            ),
        ),
        "response": {
            "type": "object",
            "required": ["records", "missing"],
            "properties": {"records": records, "missing": {"type": "array"}},
        },
    }
