"""Pulling records from a peer: pages of its `/since` endpoint inserted exactly once locally.

Each page is committed in one transaction (INSERT OR IGNORE) before the cursor moves past it;
the next page is fetched, parsed and validated while the one before commits.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote

import orjson

from config import AsyncClosing, Timeouts
from net import Identity, PeerClient, peer_url
from sync.errors import (
    RecordPullError,
    RecordRequestError,
    StoreClosedError,
    SyncError,
)
from sync.records.client import rejection
from sync.records.raw import loads_cut
from sync.records.schema import RecordSchema
from sync.records.store import RecordStore
from sync.records.types import (
    DEFAULT_PAGE_LIMIT,
    Cursor,
    IngestResult,
    PullResult,
    RecordKey,
    StoreStatus,
    StoreStatusJson,
)
from sync.records.validate import validate_records
from sync.translate import translated

Page = tuple[list[dict[str, Any]], Cursor | None]
GET_KEYS_PER_REQUEST = 100


def since_params(
    cursor: Cursor | None, limit: int, filters: Mapping[str, object] | None
) -> dict[str, str]:
    """Query parameters of one `/since` request (a filter's value as text; a float's repr)."""
    params = {"limit": str(limit)}
    if cursor is not None:
        params["ts"] = repr(float(cursor[0]))
        if cursor[1] is not None:
            params["after"] = str(cursor[1])
    for name, value in (filters or {}).items():
        params[name] = repr(value) if isinstance(value, float) else str(value)
    return params


async def _get_bytes(client: PeerClient, base_url: str, path: str, params: Any = None) -> bytes:
    url = f"{base_url.rstrip('/')}{path}"
    with translated(url, RecordRequestError):
        response = await client.request("GET", base_url, path, params=params, check=False)
    payload = response.body
    if response.status != 200:
        refusal = rejection(response.status, payload)
        if response.status in (400, 404):
            raise refusal
        raise RecordRequestError(f"{url}: HTTP {response.status}: {refusal}", response.status)
    return payload


def _decoded(url: str, payload: bytes, loads: Callable[[bytes], Any] = orjson.loads) -> Any:
    try:
        return loads(payload)
    except ValueError as exc:
        raise RecordRequestError(f"{url}: answer is not JSON", 200) from exc


async def _get_json(client: PeerClient, base_url: str, path: str, params: Any = None) -> Any:
    return _decoded(base_url + path, await _get_bytes(client, base_url, path, params))


def since_path(store: str) -> str:
    return f"/v1/records/{quote(store, safe='')}/since"


def since_url(base_url: str, store: str) -> str:
    return f"{base_url.rstrip('/')}{since_path(store)}"


async def fetch_page(
    client: PeerClient,
    base_url: str,
    store: str,
    cursor: Cursor | None,
    limit: int = DEFAULT_PAGE_LIMIT,
    filters: Mapping[str, object] | None = None,
    schema: RecordSchema | None = None,
) -> Page:
    """One page of a peer's `/since`: (records, next cursor or None).

    With `schema`, canonical array values of its json fields stay raw text (RawJson, for
    validate_records; see sync.records.raw) instead of becoming Python lists.
    """
    url = since_url(base_url, store)
    params = since_params(cursor, limit, filters)
    body = await _get_bytes(client, base_url, since_path(store), params)
    return parse_page(url, body, schema)


def parse_page(url: str, body: bytes, schema: RecordSchema | None = None) -> Page:
    """The (records, next cursor or None) of a `/since` answer `body` from `url`."""
    if schema is None:
        data = _decoded(url, body)
    else:
        data = _decoded(url, body, functools.partial(_loads_page, schema))
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


def next_hint(body: bytes) -> Cursor | None:
    """The `next` cursor of a `/since` body read from its tail, without parsing its records:
    a guess (None when there is none to read), used only to ask for the following page early
    and kept only if it equals the end of the parsed page."""
    at = body.rfind(_NEXT_KEY)
    if at < 0 or not body.endswith(b"}"):
        return None
    try:
        value = orjson.loads(body[at + len(_NEXT_KEY) : -1])
    except ValueError:
        return None
    if type(value) is not dict:
        return None
    ts: Any = value.get("ts")
    after: Any = value.get("after")
    if type(ts) not in (int, float) or not (after is None or type(after) in (str, int)):
        return None
    return float(ts), after


_NEXT_KEY = b',"next":'


def _loads_page(schema: RecordSchema, payload: bytes) -> Any:
    return loads_cut(payload, schema, _page_records)


def _page_records(doc: Any) -> Any:
    return doc.get("records") if type(doc) is dict else None


async def _finish(task: asyncio.Task[Any] | None) -> None:
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: the pull already failed or stopped for another reason


_Commit = tuple[asyncio.Task[IngestResult], int, Cursor]


class _Ledger:
    """The pages of a pull being committed, and what it committed so far: counts, and the
    cursor of the last page committed with every page before it."""

    def __init__(self, since: Cursor | None) -> None:
        self.commits: deque[_Commit] = deque()
        self.pulled = self.inserted = self.duplicates = 0
        self.cursor = since

    def result(self) -> PullResult:
        return PullResult(self.pulled, self.inserted, self.duplicates, self.cursor)

    async def settle(self, keep: int, quiet: bool = False) -> None:
        """Wait for the oldest commits until at most `keep` are in flight; `quiet`: stop at
        the first that fails, without raising."""
        while len(self.commits) > keep:
            task, count, reached = self.commits[0]
            try:
                counts = await asyncio.shield(task)
            except SyncError:
                if quiet:
                    return
                raise
            self.commits.popleft()
            self.pulled += count
            self.inserted += counts.accepted
            self.duplicates += counts.duplicates
            self.cursor = reached

    async def abandon(self) -> None:
        """Cancel the commits still in flight and wait for each to end."""
        for task, _, _ in self.commits:
            await _finish(task)


async def pull_records(
    client: PeerClient,
    base_url: str,
    store: str,
    local_store: RecordStore,
    since: Cursor | None = None,
    limit: int = DEFAULT_PAGE_LIMIT,
    filters: Mapping[str, object] | None = None,
    max_records: int | None = None,
    source_node: str = "unknown",
    store_wait_s: float = Timeouts().sync_s,
) -> PullResult:
    """Copy a peer's records after `since` into `local_store`, page by page, exactly once.

    Pipelined: the next page is asked for as soon as a page arrives (from the `next` cursor
    at its tail, kept only if it is the end of the parsed page), and a page is parsed and
    validated in a worker thread while the one before commits (the store's writer commits
    pages in order). Returns counts and the cursor of the last page committed with every
    page before it (resume from it); on failure raises RecordPullError whose `result`
    holds the same. Records are validated against the local schema; `source_node` fills
    one without a source.
    """
    ledger = _Ledger(since)
    received = 0
    schema = local_store.schema
    url = since_url(base_url, store)

    def fetch(start: Cursor | None) -> asyncio.Task[bytes]:
        params = since_params(start, limit, filters)
        return asyncio.create_task(_get_bytes(client, base_url, since_path(store), params))

    fetching: asyncio.Task[bytes] | None = fetch(since)
    start = since
    try:
        try:
            while fetching is not None:
                body = await fetching
                fetching = guess = None
                hint = next_hint(body)
                if hint is not None and _moved(hint, start):
                    fetching, guess = fetch(hint), hint
                count, following, rows, reached = await asyncio.to_thread(
                    _prepare, url, body, schema, source_node, start
                )
                if reached is None:
                    break
                received += count
                more = following is not None and (max_records is None or received < max_records)
                if fetching is not None and (not more or guess != reached):
                    await _finish(fetching)
                    fetching = None
                if more and fetching is None:
                    fetching = fetch(reached)
                start = reached
                ingest = local_store.ingest_rows(rows, wait_s=store_wait_s)
                ledger.commits.append((asyncio.create_task(ingest), count, reached))
                await ledger.settle(1)
            await ledger.settle(0)
        except SyncError as exc:
            await _finish(fetching)
            fetching = None
            await ledger.settle(0, quiet=True)  # what committed before the failure counts
            reason = f"pull of {store} from {base_url}: {exc}"
            raise RecordPullError(reason, ledger.result()) from exc
    finally:
        await _finish(fetching)
        await ledger.abandon()
    return ledger.result()


def _prepare(
    url: str, body: bytes, schema: RecordSchema, source_node: str, start: Cursor | None
) -> tuple[int, Cursor | None, list[tuple[Any, ...]], Cursor | None]:
    """Parse and validate one page (in a worker thread: the event loop stays free, and sends
    the request of the following page meanwhile): (records, the peer's next cursor, rows,
    the page's end or None for an empty page)."""
    records, following = parse_page(url, body, schema)
    if not records:
        return 0, following, [], None
    rows = validate_records(schema, records, source_node)
    return len(records), following, rows, page_end(schema.time_column, schema.key, records, start)


def _moved(reached: Cursor, before: Cursor | None) -> bool:
    if before is None:
        return True
    ts, after = before
    return reached[0] > ts or (reached[0] == ts and _key_after(reached[1], after))


def page_end(
    time_column: str, key: str, records: Sequence[dict[str, Any]], before: Cursor | None
) -> Cursor:
    """The cursor after a page of valid records; RecordRequestError unless it moved past `before`
    (a peer that keeps answering the same page must not keep a pull going forever)."""
    last = records[-1]
    reached: Cursor = (float(last[time_column]), last[key])
    if not _moved(reached, before):
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


class P2PSyncClient(AsyncClosing):
    """Reads one peer's record stores over HTTP (async context manager; close() idempotent).

    Without `peers` (a net.PeerClient, used as is and left open) it makes its own, signing
    requests with `secret` as `node_id`, each within `timeout_s`.
    """

    def __init__(
        self,
        address: str,
        port: int,
        peers: PeerClient | None = None,
        secret: bytes | None = None,
        node_id: str = "shoal",
        timeout_s: float = Timeouts().http_request_s,
        scheme: str = "http",
    ) -> None:
        self.base_url = peer_url(address, port, tls=scheme == "https")
        self._owns_client = peers is None
        if peers is None:
            timeouts = Timeouts(http_request_s=timeout_s)
            peers = PeerClient(Identity(secret, node_id), timeouts=timeouts)
        self._peers: PeerClient | None = peers

    async def close(self) -> None:
        peers, self._peers = self._peers, None
        if peers is not None and self._owns_client:
            await peers.close()

    @property
    def peers(self) -> PeerClient:
        if self._peers is None:
            raise StoreClosedError(f"sync client for {self.base_url} is closed")
        return self._peers

    async def get_status(self, store: str = "games") -> StoreStatusJson:
        """The peer's `/v1/records/{store}/status` as it answered (RecordRequestError naming
        the field that is missing or malformed)."""
        data = await _get_json(self.peers, self.base_url, f"/v1/records/{store}/status")
        try:
            StoreStatus.from_json(data)
        except ValueError as exc:
            raise RecordRequestError(f"{self.base_url}: {exc}", 200) from None
        return cast(StoreStatusJson, data)

    async def get_records(self, store: str, keys: Sequence[RecordKey]) -> list[dict[str, Any]]:
        """The peer's records with these keys (absent ones left out), via `/get?key=..`."""
        found: list[dict[str, Any]] = []
        path = f"/v1/records/{store}/get"
        url = f"{self.base_url}{path}"
        for start in range(0, len(keys), GET_KEYS_PER_REQUEST):
            params = [("key", str(key)) for key in keys[start : start + GET_KEYS_PER_REQUEST]]
            data = await _get_json(self.peers, self.base_url, path, params)
            if not isinstance(data, dict) or not isinstance(data.get("records"), list):
                raise RecordRequestError(f"{url}: answer has no records list", 200)
            found.extend(data["records"])
        return found

    async def get_games(self, game_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The peer's games with these ids (absent ones left out)."""
        return await self.get_records("games", game_ids)

    async def pull_games_since(
        self, timestamp: float, filters: Mapping[str, object] | None = None
    ) -> list[dict[str, Any]]:
        """Every game of the peer with created_at >= timestamp, in (created_at, game_id) order."""
        games: list[dict[str, Any]] = []
        cursor: Cursor = (timestamp, None)
        while True:
            records, following = await fetch_page(
                self.peers, self.base_url, "games", cursor, DEFAULT_PAGE_LIMIT, filters
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
            self.peers, self.base_url, local_store.name, local_store, since, **options
        )
