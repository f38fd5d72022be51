"""Pulling records from a peer: pages of its `/since` endpoint inserted exactly once locally.

Each page is committed in one transaction (INSERT OR IGNORE) before the cursor moves past it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from config import Timeouts, signing_middleware
from sync.errors import (
    RecordPullError,
    RecordRequestError,
    StoreClosedError,
    SyncError,
    translated,
)
from sync.records.client import rejection
from sync.records.raw import loads_cut
from sync.records.schema import RecordSchema
from sync.records.store import RecordStore
from sync.records.types import DEFAULT_PAGE_LIMIT, Cursor, PullResult, RecordKey
from sync.records.validate import validate_records

Page = tuple[list[dict[str, Any]], Cursor | None]
GET_KEYS_PER_REQUEST = 100


def since_params(
    cursor: Cursor | None, limit: int, filters: Mapping[str, Any] | None
) -> dict[str, str]:
    """Query parameters of one `/since` request."""
    params = {"limit": str(limit)}
    if cursor is not None:
        params["ts"] = repr(float(cursor[0]))
        if cursor[1] is not None:
            params["after"] = str(cursor[1])
    for name, value in (filters or {}).items():
        params[name] = repr(value) if isinstance(value, float) else str(value)
    return params


async def _get_json(
    session: aiohttp.ClientSession,
    url: str,
    params: Any = None,
    loads: Callable[[bytes], Any] = orjson.loads,
) -> Any:
    with translated(url, RecordRequestError):
        async with session.get(url, params=params) as response:
            payload = await response.read()
            if response.status != 200:
                refusal = rejection(response.status, payload)
                if response.status in (400, 404):
                    raise refusal
                raise RecordRequestError(
                    f"{url}: HTTP {response.status}: {refusal}", response.status
                )
    try:
        return loads(payload)
    except ValueError as exc:
        raise RecordRequestError(f"{url}: answer is not JSON", response.status) from exc


async def fetch_page(
    session: aiohttp.ClientSession,
    base_url: str,
    store: str,
    cursor: Cursor | None,
    limit: int = DEFAULT_PAGE_LIMIT,
    filters: Mapping[str, Any] | None = None,
    schema: RecordSchema | None = None,
) -> Page:
    """One page of a peer's `/since`: (records, next cursor or None).

    With `schema`, canonical array values of its json fields stay raw text (RawJson, for
    validate_records; see sync.records.raw) instead of becoming Python lists.
    """
    url = f"{base_url.rstrip('/')}/v1/records/{quote(store, safe='')}/since"
    params = since_params(cursor, limit, filters)
    if schema is None:
        data = await _get_json(session, url, params)
    else:
        data = await _get_json(session, url, params, functools.partial(_loads_page, schema))
    records = data.get("records") if isinstance(data, dict) else None
    following = data.get("next") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise RecordRequestError(f"{url}: answer has no records list", 200)
    if following is None:
        return records, None
    try:
        return records, (float(following["ts"]), following["after"])
    except (TypeError, KeyError, ValueError) as exc:
        raise RecordRequestError(f"{url}: bad next cursor {following!r}", 200) from exc


def _loads_page(schema: RecordSchema, payload: bytes) -> Any:
    return loads_cut(payload, schema, _page_records)


def _page_records(doc: Any) -> Any:
    return doc.get("records") if type(doc) is dict else None


async def _finish(task: asyncio.Task[Page] | None) -> None:
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: the pull already failed or stopped for another reason


async def pull_records(
    session: aiohttp.ClientSession,
    base_url: str,
    store: str,
    local_store: RecordStore,
    since: Cursor | None = None,
    limit: int = DEFAULT_PAGE_LIMIT,
    filters: Mapping[str, Any] | None = None,
    max_records: int | None = None,
    source_node: str = "unknown",
    store_wait_s: float = Timeouts().sync_s,
) -> PullResult:
    """Copy a peer's records after `since` into `local_store`, page by page, exactly once.

    The next page is fetched while the current one commits. Returns counts and the cursor of
    the last committed record (resume from it); on failure raises RecordPullError whose
    `result` holds the same. Records are validated against the local schema; `source_node`
    fills one without a source.
    """
    cursor = since
    pulled = inserted = duplicates = 0
    schema = local_store.schema

    def result() -> PullResult:
        return PullResult(pulled, inserted, duplicates, cursor)

    def failed(exc: SyncError) -> RecordPullError:
        return RecordPullError(f"pull of {store} from {base_url}: {exc}", result())

    pending: asyncio.Task[Page] | None = asyncio.create_task(
        fetch_page(session, base_url, store, since, limit, filters, schema)
    )
    try:
        while pending is not None:
            try:
                records, following = await pending
            except SyncError as exc:
                raise failed(exc) from exc
            pending = None
            if not records:
                break
            try:
                rows = validate_records(schema, records, source_node)
                reached = page_end(schema.time_column, schema.key, records, cursor)
            except SyncError as exc:
                raise failed(exc) from exc
            if following is not None and (
                max_records is None or pulled + len(records) < max_records
            ):
                pending = asyncio.create_task(
                    fetch_page(session, base_url, store, reached, limit, filters, schema)
                )
            try:
                counts = await local_store.ingest_rows(rows, wait_s=store_wait_s)
            except SyncError as exc:
                raise failed(exc) from exc
            pulled += len(records)
            inserted += counts.accepted
            duplicates += counts.duplicates
            cursor = reached
    finally:
        await _finish(pending)
    return result()


def page_end(
    time_column: str, key: str, records: Sequence[dict[str, Any]], before: Cursor | None
) -> Cursor:
    """The cursor after a page of valid records; RecordRequestError unless it moved past `before`
    (a peer that keeps answering the same page must not keep a pull going forever)."""
    last = records[-1]
    reached: Cursor = (float(last[time_column]), last[key])
    if before is not None:
        ts, after = before
        moved = reached[0] > ts or (reached[0] == ts and _key_after(reached[1], after))
        if not moved:
            raise RecordRequestError(f"the peer's page ends at {reached}, not after {before}")
    return reached


def _key_after(key: RecordKey | None, bound: RecordKey | None) -> bool:
    if bound is None:
        return True
    if isinstance(key, str) and isinstance(bound, str):
        return key > bound
    if isinstance(key, int) and isinstance(bound, int):
        return key > bound
    return False


class P2PSyncClient:
    """Reads one peer's record stores over HTTP (async context manager; close() idempotent).

    Signs requests with `secret` as `node_id` when the client makes its own session.
    """

    def __init__(
        self,
        address: str,
        port: int,
        session: aiohttp.ClientSession | None = None,
        secret: bytes | None = None,
        node_id: str = "shoal",
        timeout_s: float = Timeouts().http_request_s,
        scheme: str = "http",
    ) -> None:
        host = f"[{address}]" if ":" in address and not address.startswith("[") else address
        self.base_url = f"{scheme}://{host}:{port}"
        self._owns_session = session is None
        if session is None:
            middlewares = () if secret is None else (signing_middleware(secret, node_id),)
            session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=timeout_s), middlewares=middlewares
            )
        self._session: aiohttp.ClientSession | None = session

    async def __aenter__(self) -> P2PSyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and self._owns_session:
            await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise StoreClosedError(f"sync client for {self.base_url} is closed")
        return self._session

    async def get_status(self, store: str = "games") -> dict[str, Any]:
        """The peer's `/v1/records/{store}/status`."""
        data = await _get_json(self.session, f"{self.base_url}/v1/records/{store}/status")
        if not isinstance(data, dict):
            raise RecordRequestError(f"{self.base_url}: status is not a JSON object", 200)
        return data

    async def get_records(self, store: str, keys: Sequence[RecordKey]) -> list[dict[str, Any]]:
        """The peer's records with these keys (absent ones left out), via `/get?key=..`."""
        found: list[dict[str, Any]] = []
        url = f"{self.base_url}/v1/records/{store}/get"
        for start in range(0, len(keys), GET_KEYS_PER_REQUEST):
            params = [("key", str(key)) for key in keys[start : start + GET_KEYS_PER_REQUEST]]
            data = await _get_json(self.session, url, params)
            if not isinstance(data, dict) or not isinstance(data.get("records"), list):
                raise RecordRequestError(f"{url}: answer has no records list", 200)
            found.extend(data["records"])
        return found

    async def get_games(self, game_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The peer's games with these ids (absent ones left out)."""
        return await self.get_records("games", game_ids)

    async def pull_games_since(
        self, timestamp: float, filters: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Every game of the peer with created_at >= timestamp, in (created_at, game_id) order."""
        games: list[dict[str, Any]] = []
        cursor: Cursor = (timestamp, None)
        while True:
            records, following = await fetch_page(
                self.session, self.base_url, "games", cursor, DEFAULT_PAGE_LIMIT, filters
            )
            games.extend(records)
            if following is None or not records:
                return games
            try:
                cursor = page_end("created_at", "game_id", records, cursor)
            except (KeyError, TypeError, ValueError) as exc:
                raise RecordRequestError(f"{self.base_url}: malformed game record") from exc

    async def pull_into(
        self, local_store: RecordStore, since: Cursor | None = None, **options: Any
    ) -> PullResult:
        """pull_records from this peer's store of the same name into `local_store`."""
        return await pull_records(
            self.session, self.base_url, local_store.name, local_store, since, **options
        )
