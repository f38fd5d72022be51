"""apply_batch: one transaction per batch, ids and counters exact across insert chunk sizes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from wal import EntryState, WalConfig
from wal.batch import AppendRequest, TransitionRequest, apply_batch, pending_from
from wal.schema import open_write_connection


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = open_write_connection(tmp_path / "wal.db", WalConfig())
    yield connection
    connection.close()


@pytest.mark.parametrize("size", [1, 3, 127, 128, 129, 300, 1024])
def test_appends_of_any_batch_size_get_consecutive_ids(conn: sqlite3.Connection, size: int) -> None:
    first = apply_batch(conn, [AppendRequest("t", None, "{}", 1.0)], 5, 1.0)
    requests = [AppendRequest("t", None, json.dumps({"n": n}), 2.0) for n in range(size)]
    outcome = apply_batch(conn, requests, 5, 2.0)
    assert first.results == [1]
    assert outcome.results == list(range(2, size + 2))
    assert outcome.counters["last_id"] == outcome.counters["appended_total"] == size + 1
    rows = conn.execute("SELECT id, payload, state FROM entries WHERE id > 1 ORDER BY id")
    assert [(i, json.loads(p)["n"], s) for i, p, s in rows] == [
        (n + 2, n, "pending") for n in range(size)
    ]


def test_keyed_duplicates_in_and_across_batches_share_one_id(conn: sqlite3.Connection) -> None:
    batch = [AppendRequest("t", key, "{}", 1.0) for key in ("a", "b", "a", None, "b")]
    outcome = apply_batch(conn, batch, 5, 1.0)
    assert outcome.results == [1, 2, 1, 3, 2]
    again = apply_batch(conn, [AppendRequest("t", "b", "{}", 2.0)], 5, 2.0)
    assert again.results == [2]
    assert again.counters["appended_total"] == 3


def test_transitions_report_state_and_whether_they_changed_it(conn: sqlite3.Connection) -> None:
    apply_batch(conn, [AppendRequest("t", None, "{}", 1.0) for _ in range(2)], 2, 1.0)
    outcome = apply_batch(
        conn,
        [
            TransitionRequest(1, EntryState.COMMITTED, None),
            TransitionRequest(1, EntryState.COMMITTED, None),
            TransitionRequest(2, EntryState.FAILED, "x"),
            TransitionRequest(2, EntryState.FAILED, "y"),
            TransitionRequest(2, EntryState.FAILED, "z"),
        ],
        2,
        2.0,
    )
    assert outcome.results == [
        (EntryState.COMMITTED, True),
        (EntryState.COMMITTED, False),
        (EntryState.PENDING, True),
        (EntryState.FAILED, True),
        (EntryState.FAILED, False),
    ]
    assert pending_from(outcome.counters) == 0
    assert outcome.counters["retries_total"] == 2


def test_a_failing_batch_leaves_nothing_behind(conn: sqlite3.Connection) -> None:
    apply_batch(conn, [AppendRequest("t", None, "{}", 1.0)], 5, 1.0)
    conn.execute(
        "CREATE TRIGGER poison BEFORE INSERT ON entries WHEN NEW.entry_type = 'poison'"
        " BEGIN SELECT RAISE(ABORT, 'injected'); END"
    )
    requests = [AppendRequest("t", None, "{}", 2.0), AppendRequest("poison", None, "{}", 2.0)]
    with pytest.raises(sqlite3.IntegrityError, match="injected"):
        apply_batch(conn, requests, 5, 2.0)
    assert not conn.in_transaction
    assert conn.execute("SELECT count(*) FROM entries").fetchone() == (1,)
    last_id = conn.execute("SELECT value FROM counters WHERE name = 'last_id'").fetchone()
    assert last_id == (1,)
