"""Plain data of record stores: options, results, status, pages and the since-query.

Also the pure parsing of a `/since` query into a SinceQuery and of a `/get` key list.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from sync.errors import RecordQueryError
from sync.records.cursor import Cursor, PullResult, RecordKey
from sync.records.schema import INT64_MAX, INT64_MIN, FieldKind, RecordSchema

__all__ = [
    "DEFAULT_PAGE_LIMIT",
    "MAX_GET_KEYS",
    "MAX_PAGE_LIMIT",
    "Cursor",
    "CursorJson",
    "IngestResult",
    "PullResult",
    "RecordKey",
    "RecordPage",
    "RecordPageJson",
    "SinceQuery",
    "SnapshotInfo",
    "StoreOptions",
    "StoreStatus",
    "StoreStatusJson",
    "parse_get_keys",
    "parse_key",
    "parse_since_query",
    "since_sql",
]

DEFAULT_PAGE_LIMIT = 1000
MAX_PAGE_LIMIT = 10_000
MAX_GET_KEYS = 1000


@dataclass(frozen=True)
class StoreOptions:
    """How a RecordStore writes, queues and checkpoints.

    max_pending_records bounds the records admitted but not yet committed; a request that does
    not fit waits up to max_wait_s, then fails with StoreBusyError (HTTP 503, Retry-After).
    """

    busy_timeout_s: float = 5.0
    max_pending_records: int = 50_000
    max_wait_s: float = 2.0
    retry_after_s: float = 1.0
    max_batch_records: int = 50_000
    checkpoint_pages: int = 4096
    idle_checkpoint_s: float = 1.0
    journal_size_limit_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class IngestResult:
    """Records of a request newly committed (`accepted`) and already present (`duplicates`)."""

    accepted: int = 0
    duplicates: int = 0

    def __add__(self, other: IngestResult) -> IngestResult:
        return IngestResult(self.accepted + other.accepted, self.duplicates + other.duplicates)

    def to_json(self) -> dict[str, int]:
        return {"accepted": self.accepted, "duplicates": self.duplicates}


class StoreStatusJson(TypedDict):
    store: str
    count: int
    newest_created_at: float | None
    size_bytes: int


@dataclass(frozen=True)
class StoreStatus:
    """What `/v1/records/{store}/status` answers."""

    store: str
    count: int
    newest_created_at: float | None
    size_bytes: int

    def to_json(self) -> StoreStatusJson:
        return {
            "store": self.store,
            "count": self.count,
            "newest_created_at": self.newest_created_at,
            "size_bytes": self.size_bytes,
        }

    @classmethod
    def from_json(cls, data: object) -> StoreStatus:
        """The status a node answered; ValueError naming the field that is missing or of the
        wrong type."""
        if not isinstance(data, dict):
            raise ValueError(f"a store status is a JSON object, not {type(data).__name__}")
        store, newest = data.get("store"), data.get("newest_created_at")
        if not isinstance(store, str):
            raise ValueError(f"store status field 'store' is {store!r}, not a name")
        if newest is not None and (isinstance(newest, bool) or not isinstance(newest, int | float)):
            raise ValueError(f"store status field 'newest_created_at' is {newest!r}")
        return cls(
            store,
            _count(data, "count"),
            None if newest is None else float(newest),
            _count(data, "size_bytes"),
        )


def _count(data: Mapping[str, object], field: str) -> int:
    value = data.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"store status field {field!r} is {value!r}, not an integer >= 0")
    return value


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot written by RecordStore.snapshot_to: complete, fsynced and renamed into place."""

    path: str
    records: int
    size_bytes: int


class CursorJson(TypedDict):
    """A Cursor on the wire: the next page's (time, key)."""

    ts: float
    after: RecordKey | None


class RecordPageJson(TypedDict):
    records: list[dict[str, Any]]
    """The records, each as its store's schema says (sync.records.schema.record_json_schema)."""
    next: CursorJson | None


@dataclass(frozen=True)
class RecordPage:
    """One page of a since-query; `next` is the cursor of the following page, or None at the end."""

    records: list[dict[str, Any]]
    next: Cursor | None

    def to_json(self) -> RecordPageJson:
        cursor: CursorJson | None = (
            None if self.next is None else {"ts": self.next[0], "after": self.next[1]}
        )
        return {"records": self.records, "next": cursor}


@dataclass(frozen=True)
class SinceQuery:
    """Records with (time, key) > (ts, after) in that order, at most `limit`, filtered.

    Without `after`, every record with time >= ts. `minimums` are (field, lower bound inclusive);
    `equals` are (field, value).
    """

    ts: float = -math.inf
    after: RecordKey | None = None
    limit: int = DEFAULT_PAGE_LIMIT
    minimums: tuple[tuple[str, float], ...] = ()
    equals: tuple[tuple[str, Any], ...] = field(default=())


def parse_key(schema: RecordSchema, param: str, text: str) -> RecordKey:
    """A key given in a query string, as the key field's type."""
    if schema.field(schema.key).kind is FieldKind.INTEGER:
        return _int64(param, text, "expected an integer key")
    return text


def _int64(param: str, text: str, message: str) -> int:
    """`text` as an integer the stores can hold (64 bits), else RecordQueryError(message)."""
    try:
        value = int(text)
    except ValueError:
        raise RecordQueryError(param, message) from None
    if not INT64_MIN <= value <= INT64_MAX:
        raise RecordQueryError(param, f"{value} is outside the 64-bit integer range")
    return value


def _single(query: Mapping[str, str] | Any, name: str) -> str:
    getall = getattr(query, "getall", None)
    values = getall(name) if getall is not None else [query[name]]
    if len(values) != 1:
        raise RecordQueryError(name, "given more than once")
    return str(values[0])


def _number(param: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RecordQueryError(param, f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise RecordQueryError(param, "expected a finite number")
    return value


def parse_since_query(
    schema: RecordSchema, query: Mapping[str, str], max_limit: int = MAX_PAGE_LIMIT
) -> SinceQuery:
    """Parse `ts`, `after`, `limit`, `min_<number field>` and `<text field>` (equality) filters.

    Raises RecordQueryError naming the parameter for anything else or any bad value.
    """
    ts = -math.inf
    after: RecordKey | None = None
    limit = DEFAULT_PAGE_LIMIT
    minimums: list[tuple[str, float]] = []
    equals: list[tuple[str, Any]] = []
    kinds = {spec.name: spec.kind for spec in schema.fields}
    for name in sorted(set(query)):
        text = _single(query, name)
        if name == "ts":
            ts = _number(name, text)
        elif name == "after":
            after = parse_key(schema, name, text)
        elif name == "limit":
            if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= max_limit:
                raise RecordQueryError(name, f"expected an integer 1-{max_limit}, got {text!r}")
            limit = int(text)
        elif name.startswith("min_") and kinds.get(name[4:]) in (FieldKind.REAL, FieldKind.INTEGER):
            minimums.append((name[4:], _number(name, text)))
        elif kinds.get(name) is FieldKind.TEXT:
            equals.append((name, text))
        elif kinds.get(name) is FieldKind.INTEGER:
            equals.append((name, _int64(name, text, f"expected an integer, got {text!r}")))
        else:
            raise RecordQueryError(name, "unknown parameter")
    if after is not None and "ts" not in query:
        raise RecordQueryError("after", "needs ts")
    return SinceQuery(ts, after, limit, tuple(minimums), tuple(equals))


def since_sql(schema: RecordSchema, query: SinceQuery) -> tuple[str, list[Any]]:
    """The SELECT (and its parameters) that answers `query`; field names come from the schema."""
    time, key = f'"{schema.time_column}"', f'"{schema.key}"'
    columns = set(schema.columns)
    params: list[Any] = []
    if query.after is None:
        where = [f"{time} >= ?"]
        params.append(query.ts)
    else:
        where = [f"({time}, {key}) > (?, ?)"]
        params.extend((query.ts, query.after))
    for name, low in query.minimums:
        assert name in columns
        where.append(f'"{name}" >= ?')
        params.append(low)
    for name, value in query.equals:
        assert name in columns
        where.append(f'"{name}" = ?')
        params.append(value)
    names = ", ".join(f'"{name}"' for name in schema.columns)
    sql = (
        f'SELECT {names} FROM "{schema.name}" WHERE {" AND ".join(where)} '  # noqa: S608
        f"ORDER BY {time}, {key} LIMIT ?"
    )
    params.append(query.limit)
    return sql, params


def parse_get_keys(schema: RecordSchema, keys: Sequence[str]) -> list[RecordKey]:
    """The `key` parameters of a `/get` request: 1 to MAX_GET_KEYS of them."""
    if not 1 <= len(keys) <= MAX_GET_KEYS:
        raise RecordQueryError("key", f"give 1-{MAX_GET_KEYS} key parameters, got {len(keys)}")
    return [parse_key(schema, "key", text) for text in keys]
