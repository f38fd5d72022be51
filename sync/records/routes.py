"""HTTP routes of the record stores: ingest (JSON or NDJSON), status, since-pages and lookups.

Every refusal is JSON `{"error": code, "reason": text, "status": N}` (config.wire); client input
never causes a 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from config import error_response as error_answer
from sync.errors import (
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
from sync.records.schema import RecordSchema
from sync.records.store import RecordStore
from sync.records.types import MAX_PAGE_LIMIT, parse_get_keys, parse_since_query
from sync.records.validate import validate_records

DEFAULT_MAX_RECORDS = 10_000
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
NDJSON_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/x-jsonlines"})
PREFIX = "/v1/records"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
) -> list[web.RouteDef]:
    """Routes under /v1/records serving `stores` (looked up per request, so a RecordStores that
    opens later works); `node_id` fills a record's absent source node.
    """

    def store_of(request: web.Request) -> RecordStore:
        name = request.match_info["store"]
        store = stores.get(name)
        if store is None:
            raise UnknownStoreError(name)
        return store

    async def ingest(request: web.Request) -> web.StreamResponse:
        store = store_of(request)
        body = await read_body(request, max_body_bytes)
        if body is None:
            return _refusal(413, "too_large", f"request body exceeds {max_body_bytes} bytes")
        records = parse_body(body, request.content_type in NDJSON_TYPES, store.schema)
        if len(records) > max_records:
            return _refusal(
                413,
                "too_many_records",
                f"{len(records)} records in one request; at most {max_records} are accepted",
            )
        rows = validate_records(store.schema, records, node_id)
        result = await store.ingest_rows(rows)
        return web.json_response(result.to_json())

    async def status(request: web.Request) -> web.StreamResponse:
        return web.json_response(store_of(request).status().to_json())

    async def all_status(request: web.Request) -> web.StreamResponse:
        statuses = [stores[name].status().to_json() for name in sorted(stores)]
        return web.json_response({"stores": statuses})

    async def since(request: web.Request) -> web.StreamResponse:
        store = store_of(request)
        query = parse_since_query(store.schema, request.query, MAX_PAGE_LIMIT)
        body = await store.since_json(query)
        return web.Response(body=body, content_type="application/json")

    async def get(request: web.Request) -> web.StreamResponse:
        store = store_of(request)
        keys = parse_get_keys(store.schema, request.query.getall("key", []))
        extra = set(request.query) - {"key"}
        if extra:
            raise RecordQueryError(sorted(extra)[0], "unknown parameter")
        records = await store.get(keys)
        found = {record[store.schema.key] for record in records}
        missing = [key for key in dict.fromkeys(keys) if key not in found]
        return web.json_response({"records": records, "missing": missing}, dumps=_dumps_text)

    return [
        web.get(PREFIX, _guarded(all_status)),
        web.post(PREFIX + "/{store}", _guarded(ingest)),
        web.get(PREFIX + "/{store}/status", _guarded(status)),
        web.get(PREFIX + "/{store}/since", _guarded(since)),
        web.get(PREFIX + "/{store}/get", _guarded(get)),
    ]


def record_route_docs() -> list[dict[str, Any]]:
    """OpenAPI notes of the record routes, as keyword arguments of node's RouteDoc."""
    store = ("store", "path", "Record store name: games, rollouts or a configured one")
    refusals = ((400, "bad query, naming the parameter"), (404, "unknown store"))
    return [
        {"method": "GET", "path": PREFIX, "summary": "Status of every record store"},
        {
            "method": "POST",
            "path": PREFIX + "/{store}",
            "summary": "Ingest a JSON array (or NDJSON) of records; answered once durable",
            "responses": (
                (200, '{"accepted": N, "duplicates": M}'),
                (400, "invalid record or malformed JSON; nothing written"),
                (404, "unknown store"),
                (413, "too many records or too large a body"),
                (503, "queue full or store unavailable; see Retry-After"),
                (507, "disk full: nothing written; path and free_bytes name the disk"),
            ),
            "parameters": (store,),
        },
        {
            "method": "GET",
            "path": PREFIX + "/{store}/status",
            "summary": "count, newest_created_at and size_bytes of a store",
            "responses": ((200, "OK"), (404, "unknown store")),
            "parameters": (store,),
        },
        {
            "method": "GET",
            "path": PREFIX + "/{store}/since",
            "summary": "Records after (ts, after) in (time, key) order, with the next cursor",
            "responses": ((200, '{"records": [...], "next": {"ts", "after"} | null}'), *refusals),
            "parameters": (
                store,
                ("ts", "query", "Time bound; without `after`, records with time >= ts"),
                ("after", "query", "Key bound: records with (time, key) > (ts, after)"),
                ("limit", "query", f"Page size, 1-{MAX_PAGE_LIMIT} (default 1000)"),
                ("min_<field>", "query", "Lower bound of a number field, e.g. min_quality"),
                ("<field>", "query", "Equality on a text or integer field, e.g. board_type"),
            ),
        },
        {
            "method": "GET",
            "path": PREFIX + "/{store}/get",
            "summary": "Records by key: ?key=a&key=b (1-1000 keys); absent ones listed in missing",
            "responses": ((200, '{"records": [...], "missing": [...]}'), *refusals),
            "parameters": (store, ("key", "query", "A record key; repeat for more")),
        },
    ]
