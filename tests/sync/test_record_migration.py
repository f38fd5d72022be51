"""A store made by an earlier release, whose column type has since changed (rollouts'
`model_version` was TEXT, now INTEGER): migrated on open when every value converts, refused with
a message naming the file, column and value when one does not, and left as it was then."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sync import ROLLOUTS_SCHEMA, RecordStore, SinceQuery, StoreWriteError
from tests.sync.record_fixtures import SMALL, rollout

OLD_TABLE = (
    'CREATE TABLE "rollouts" ("sample_id" TEXT NOT NULL PRIMARY KEY, "created_at" REAL NOT NULL, '
    '"model_version" TEXT NOT NULL, "payload" TEXT, "run" TEXT) STRICT'
)


def old_store(path: Path, versions: list[str]) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(OLD_TABLE)
        conn.execute('CREATE INDEX "rollouts_by_time" ON "rollouts" ("created_at", "sample_id")')
        for index, version in enumerate(versions):
            conn.execute(
                "INSERT INTO rollouts VALUES (?, ?, ?, ?, ?)",
                (f"old-{index}", 1_600_000_000.0 + index, version, '{"r": 1}', "run-a"),
            )
    conn.close()


def declared_type(path: Path, column: str) -> str:
    with sqlite3.connect(path) as conn:
        rows = conn.execute('PRAGMA table_info("rollouts")').fetchall()
    conn.close()
    return next(str(row[2]) for row in rows if row[1] == column)


async def test_text_versions_become_integers(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.db"
    old_store(path, ["1", "2", "17"])
    async with RecordStore(path, ROLLOUTS_SCHEMA, SMALL) as store:
        page = await store.since(SinceQuery(limit=10))
        assert [r["model_version"] for r in page.records] == [1, 2, 17]
        assert all(type(r["model_version"]) is int for r in page.records)
        assert page.records[0]["payload"] == {"r": 1}
        result = await store.ingest([rollout(1)], "node-a")
        assert result.accepted == 1
        assert (await store.since(SinceQuery(limit=10))).records[-1]["model_version"] == 1
    assert declared_type(path, "model_version") == "INTEGER"
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert tables == {"rollouts", "rollouts_by_time", "sqlite_autoindex_rollouts_1"}


async def test_a_value_that_does_not_convert_refuses_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.db"
    old_store(path, ["1", "v3"])
    with pytest.raises(StoreWriteError) as caught:
        async with RecordStore(path, ROLLOUTS_SCHEMA, SMALL):
            pass
    message = str(caught.value)
    assert str(path) in message
    assert "'model_version'" in message
    assert "'v3'" in message
    assert declared_type(path, "model_version") == "TEXT"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM rollouts").fetchone()[0] == 2
    conn.close()
