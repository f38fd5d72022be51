"""One batch of write requests applied in a single SQLite transaction on the writer's thread.

Durable counters are read and written inside the same transaction, so ids and totals stay exact.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from wal.entry import EntryState
from wal.errors import WalError
from wal.schema import read_counters

_KEY_LOOKUP_CHUNK = 500
_INSERT_HEAD = "INSERT INTO entries (id, entry_type, key, payload, state, created_at, updated_at)"
_KEYED_ROW = "(?, ?, ?, ?, 'pending', ?, ?)"
# A row without a key says NULL in the statement: binding None costs the sqlite3 module a failed
# adapter lookup (an AttributeError built and dropped) per row, a fifth of a batch's binding.
_KEYLESS_ROW = "(?, ?, NULL, ?, 'pending', ?, ?)"
# Rows go in as multi-row INSERTs of power-of-two sizes: one statement step (and one release
# of the GIL) per chunk instead of per row halves the cost of a row, and there are few distinct
# statements to prepare. 128 rows * 6 parameters stays below SQLite's oldest limit of 999.
_INSERT_CHUNK_ROWS = 128
_CHUNK_SIZES = tuple(1 << bit for bit in range(_INSERT_CHUNK_ROWS.bit_length()))
_INSERT_KEYED = {
    rows: f"{_INSERT_HEAD} VALUES {', '.join([_KEYED_ROW] * rows)}" for rows in _CHUNK_SIZES
}
_INSERT_KEYLESS = {
    rows: f"{_INSERT_HEAD} VALUES {', '.join([_KEYLESS_ROW] * rows)}" for rows in _CHUNK_SIZES
}
_FINISH_SQL = (
    "UPDATE entries SET state = ?, updated_at = ?, error = coalesce(?, error)"
    " WHERE id = ? AND state = 'pending' RETURNING state"
)
_FAIL_SQL = (
    "UPDATE entries SET retries = retries + 1, error = ?, updated_at = ?,"
    " state = CASE WHEN retries + 1 >= ? THEN 'failed' ELSE 'pending' END"
    " WHERE id = ? AND state = 'pending' RETURNING state"
)
_CLEANUP_SQL = (
    "DELETE FROM entries WHERE id IN (SELECT id FROM entries"
    " WHERE state != 'pending' AND updated_at < ? ORDER BY updated_at LIMIT ?) RETURNING state"
)
_TOTAL_OF = {
    EntryState.COMMITTED: "committed_total",
    EntryState.ROLLED_BACK: "rolled_back_total",
    EntryState.FAILED: "failed_total",
}


# Requests are NamedTuples, not frozen dataclasses: just as immutable, and built once per
# append on the hot path, where a frozen dataclass's __init__ costs four times as much.
class AppendRequest(NamedTuple):
    entry_type: str
    key: str | None
    payload_json: str
    created_at: float


new_append: Callable[[tuple[str, str | None, str, float]], AppendRequest] = functools.partial(
    tuple.__new__, AppendRequest
)
"""An AppendRequest from its four fields, without the Python-level __new__ of a NamedTuple."""


class TransitionRequest(NamedTuple):
    """Finish a pending entry (COMMITTED, ROLLED_BACK) or count a failed try (FAILED)."""

    entry_id: int
    target: EntryState
    error: str | None


class StateSetRequest(NamedTuple):
    key: str
    value_json: str


class CleanupRequest(NamedTuple):
    cutoff: float
    limit: int


Request = AppendRequest | TransitionRequest | StateSetRequest | CleanupRequest
# An append yields its id; a transition the entry's state and whether this request changed it.
Result = int | tuple[EntryState, bool] | None | WalError


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    results: list[Result]
    counters: dict[str, int]


def pending_from(counters: dict[str, int]) -> int:
    """Pending entries implied by the durable totals: every entry starts pending, ends once."""
    finished = sum(counters[name] for name in _TOTAL_OF.values())
    return counters["appended_total"] - finished


def apply_batch(
    conn: sqlite3.Connection, requests: Sequence[Request], max_retries: int, now: float
) -> BatchOutcome:
    """Apply `requests` in one transaction; returns once COMMIT (and its fsync) returned."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        counters = read_counters(conn)
        before = dict(counters)
        results: list[Result] = [None] * len(requests)
        appends: list[tuple[int, AppendRequest]] = []
        others: list[tuple[int, Request]] = []
        for index, request in enumerate(requests):
            if isinstance(request, AppendRequest):
                appends.append((index, request))
            else:
                others.append((index, request))
        if appends:
            _apply_appends(conn, appends, counters, results)
        for index, other in others:
            if isinstance(other, TransitionRequest):
                results[index] = _transition(conn, other, counters, max_retries, now)
            elif isinstance(other, StateSetRequest):
                conn.execute(
                    "INSERT OR REPLACE INTO node_state (key, value, updated_at) VALUES (?, ?, ?)",
                    (other.key, other.value_json, now),
                )
            elif isinstance(other, CleanupRequest):
                results[index] = _cleanup(conn, other, counters)
        changed = [(value, name) for name, value in counters.items() if before[name] != value]
        conn.executemany("UPDATE counters SET value = ? WHERE name = ?", changed)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the original error is what matters
                conn.execute("ROLLBACK")
        raise
    return BatchOutcome(results, counters)


def _apply_appends(
    conn: sqlite3.Connection,
    appends: list[tuple[int, AppendRequest]],
    counters: dict[str, int],
    results: list[Result],
) -> None:
    keys = list({r.key for _, r in appends if r.key is not None})
    existing: dict[str, int] = {}
    for start in range(0, len(keys), _KEY_LOOKUP_CHUNK):
        chunk = keys[start : start + _KEY_LOOKUP_CHUNK]
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT key, id FROM entries WHERE key IN ({marks})"  # noqa: S608 (only ? marks)
        existing.update((str(k), int(v)) for k, v in conn.execute(sql, chunk))
    next_id = counters["last_id"]
    keyed: list[object] = []
    keyless: list[object] = []
    for index, (entry_type, key, payload_json, created_at) in appends:
        if key is None:
            next_id += 1
            results[index] = next_id
            keyless += (next_id, entry_type, payload_json, created_at, created_at)
        elif key in existing:
            results[index] = existing[key]
        else:
            next_id += 1
            results[index] = next_id
            existing[key] = next_id
            keyed += (next_id, entry_type, key, payload_json, created_at, created_at)
    _insert_rows(conn, _INSERT_KEYED, 6, keyed)
    _insert_rows(conn, _INSERT_KEYLESS, 5, keyless)
    counters["appended_total"] += next_id - counters["last_id"]
    counters["last_id"] = next_id


def _insert_rows(
    conn: sqlite3.Connection, statements: dict[int, str], per_row: int, params: list[object]
) -> None:
    """Insert the rows whose `per_row` parameters are laid out flat in `params`, in a few
    statements."""
    remaining = len(params) // per_row
    start = 0
    while remaining:
        rows = min(_INSERT_CHUNK_ROWS, 1 << (remaining.bit_length() - 1))
        end = start + rows * per_row
        conn.execute(statements[rows], params[start:end])
        start, remaining = end, remaining - rows


def _transition(
    conn: sqlite3.Connection,
    request: TransitionRequest,
    counters: dict[str, int],
    max_retries: int,
    now: float,
) -> Result:
    if request.target is EntryState.FAILED:
        params: tuple[object, ...] = (request.error, now, max_retries, request.entry_id)
        row = conn.execute(_FAIL_SQL, params).fetchone()
    else:
        params = (request.target.value, now, request.error, request.entry_id)
        row = conn.execute(_FINISH_SQL, params).fetchone()
    if row is not None:
        state = EntryState(row[0])
        if request.target is EntryState.FAILED:
            counters["retries_total"] += 1
        if state.finished:
            counters[_TOTAL_OF[state]] += 1
        return (state, True)
    current = conn.execute("SELECT state FROM entries WHERE id = ?", (request.entry_id,))
    found = current.fetchone()
    if found is None:
        return WalError(f"no WAL entry with id {request.entry_id}")
    return (EntryState(found[0]), False)


def _cleanup(conn: sqlite3.Connection, request: CleanupRequest, counters: dict[str, int]) -> int:
    removed = conn.execute(_CLEANUP_SQL, (request.cutoff, request.limit)).fetchall()
    for (state,) in removed:
        counters[f"removed_{state}"] += 1
    return len(removed)


def checkpoint(conn: sqlite3.Connection, mode: str, busy_timeout_s: float) -> tuple[int, int, int]:
    """Run a WAL checkpoint (PASSIVE or TRUNCATE): (busy, frames in -wal, frames copied).

    TRUNCATE is tried without waiting for readers (busy=1 when one is active): it runs on the
    writer's thread, so waiting would hold up every write queued behind it.
    """
    if mode not in ("PASSIVE", "TRUNCATE"):
        raise ValueError(f"unsupported checkpoint mode {mode!r}")
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        busy, frames, copied = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    return int(busy), int(frames), int(copied)
