"""HTTP routes of the record stores: ingest (JSON or NDJSON), status, since-pages and lookups.

Every refusal is JSON `{"error": code, "reason": text, "status": N}` (config.wire); client input
never causes a 500.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import orjson
from aiohttp import web

from config import error_response as error_answer
from config.declare import READ, Caller, Refusal, route, route_defs
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
from sync.records.operations import (
    PREFIX,
    StoresStatus,
    StoreStatusAnswer,
    get_doc,
    ingest_doc,
    per_store,
    since_doc,
    status_doc,
)
from sync.records.raw import loads_cut
from sync.records.schema import RecordSchema
from sync.records.sqlite import Row
from sync.records.store import RecordStore
from sync.records.types import (
    MAX_PAGE_LIMIT,
    IngestResult,
    parse_get_keys,
    parse_since_query,
)
from sync.records.validate import validate_records

DEFAULT_MAX_RECORDS = 10_000
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
NDJSON_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/x-jsonlines"})

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


Method = Callable[[Any, web.Request], Awaitable[web.StreamResponse]]


def _guarded(fn: Method) -> Method:
    """A handler whose SyncError is answered with its error (error_response)."""

    @functools.wraps(fn)
    async def handler(self: Any, request: web.Request) -> web.StreamResponse:
        try:
            return await fn(self, request)
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
    """The record routes (RecordHandlers') as plain aiohttp routes, for an app without the
    node's access rules; arguments as RecordHandlers'."""
    handlers = RecordHandlers(stores, node_id, max_records, max_body_bytes, on_ingest, gate)
    return route_defs(handlers)


WRITERS = (Caller.PEER, Caller.OPERATOR)
"""Who ingests records: producers (operators' programs, a node's own processes) and nodes."""
UNKNOWN_STORE = Refusal(404, "unknown_store", "no such record store")
STORE = ("store", "path", "the record store's name")


class RecordHandlers:
    """The routes under /v1/records serving `stores` (looked up per request, so a RecordStores
    that opens later works), each declared on its handler, documented once per store;
    `node_id` fills a record's absent source node; `on_ingest(store, accepted, duplicates)`
    hears of every durable ingest (the node's metrics); `gate` admits (or refuses) every POSTed
    request's rows before they are written, and may answer 429 for the stores in `gated`. A
    SyncError is answered in the one error shape."""

    def __init__(
        self,
        stores: Mapping[str, RecordStore],
        node_id: str,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        on_ingest: Callable[[str, int, int], None] | None = None,
        gate: IngestGate | None = None,
        gated: Collection[str] = (),
    ) -> None:
        self._stores = stores
        self._node_id = node_id
        self.max_records = max_records
        self._max_body_bytes = max_body_bytes
        self._on_ingest = on_ingest
        self._gate = gate
        self.gated = frozenset(gated)

    def schemas(self) -> list[RecordSchema]:
        """The schemas of the stores served, by name."""
        return [self._stores[name].schema for name in sorted(self._stores)]

    def store_of(self, request: web.Request) -> RecordStore:
        name = request.match_info["store"]
        store = self._stores.get(name)
        if store is None:
            raise UnknownStoreError(name)
        return store

    @route(
        "POST",
        PREFIX + "/{store}",
        callers=WRITERS,
        params=(STORE,),
        each=lambda handlers, found: [
            ingest_doc(found, s, handlers.max_records, s.name in handlers.gated)
            for s in handlers.schemas()
        ],
        summary="Ingest a JSON array (or NDJSON, one record per line) of records",
    )
    @_guarded
    async def ingest(self, request: web.Request) -> web.StreamResponse:
        store = self.store_of(request)
        body = await read_body(request, self._max_body_bytes)
        if body is None:
            return _refusal(413, "too_large", f"request body exceeds {self._max_body_bytes} bytes")
        records = parse_body(body, request.content_type in NDJSON_TYPES, store.schema)
        if len(records) > self.max_records:
            return _refusal(
                413,
                "too_many_records",
                f"{len(records)} records in one request; at most {self.max_records} are accepted",
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

    @route(
        "GET",
        PREFIX + "/{store}/status",
        callers=READ,
        errors=[UNKNOWN_STORE],
        params=(STORE,),
        answer=StoreStatusAnswer,
        each=per_store(status_doc),
        summary="count, newest_created_at and size_bytes of a store",
    )
    @_guarded
    async def status(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.store_of(request).status().to_json())

    @route("GET", PREFIX, callers=READ, answer=StoresStatus)
    @_guarded
    async def all_status(self, request: web.Request) -> web.StreamResponse:
        """Status of every record store"""
        statuses = [self._stores[name].status().to_json() for name in sorted(self._stores)]
        return web.json_response({"stores": statuses})

    @route(
        "GET",
        PREFIX + "/{store}/since",
        callers=READ,
        params=(STORE,),
        each=per_store(since_doc),
        summary="Records after (ts, after) in (time, key) order, with the next cursor",
    )
    @_guarded
    async def since(self, request: web.Request) -> web.StreamResponse:
        store = self.store_of(request)
        query = parse_since_query(store.schema, request.query, MAX_PAGE_LIMIT)
        body = await store.since_json(query)
        return web.Response(body=body, content_type="application/json")

    @route(
        "GET",
        PREFIX + "/{store}/get",
        callers=READ,
        params=(STORE,),
        each=per_store(get_doc),
        summary="Records by key: ?key=a&key=b; absent ones in missing",
    )
    @_guarded
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
