"""Every statement the WAL runs binds plain `?` from a sequence or named placeholders from a
mapping: Python 3.12 deprecates numbered or named placeholders bound from a sequence, an error
under the suite's filterwarnings. The check does not need 3.12: it reads the SQL and the kind
of parameters of each statement the WAL executes, and scans the product's SQL text."""

from __future__ import annotations

import ast
import re
import sqlite3
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.wal.conftest import FAST
from wal import EntryState, WalEntry, WriteAheadLog

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("config", "net", "wal", "health", "sync", "node", "bench")
_LITERALS = re.compile(r"'(?:[^']|'')*'")
_NAMED = re.compile(r"\?\d|[:@$][A-Za-z_]")
_NUMBERED = re.compile(r"\?\d")


def named_placeholders(sql: str) -> list[str]:
    """Placeholders of `sql` that are numbered (?1) or named (:a, @a, $a); literals skipped."""
    return _NAMED.findall(_LITERALS.sub("''", sql))


Executed = list[tuple[str, object]]


def _recording_connect(executed: Executed) -> Any:
    connect = sqlite3.connect

    class Recording(sqlite3.Connection):
        def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
            executed.append((sql, parameters))
            return super().execute(sql, parameters)

        def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
            rows = list(parameters)
            executed.extend((sql, row) for row in rows[:1])
            return super().executemany(sql, rows)

    def recording(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, **kwargs, factory=Recording)

    return recording


def test_named_placeholders_are_found_outside_literals() -> None:
    assert named_placeholders("SELECT * FROM t WHERE a > ?1 AND b = :b") == ["?1", ":b"]
    assert named_placeholders("SELECT ? FROM t WHERE s = 'x:y ?1' AND d = @d") == ["@d"]
    assert named_placeholders("UPDATE t SET a = ?, b = coalesce(?, b)") == []


async def test_every_wal_statement_binds_its_parameters_by_their_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executed: Executed = []
    monkeypatch.setattr(sqlite3, "connect", _recording_connect(executed))
    path = tmp_path / "wal.db"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        async with WriteAheadLog(path, config=FAST) as wal:
            first = await wal.append("game_recorded", {"n": 1}, key="g-1")
            second = await wal.append("game_recorded", {"n": 2})
            third = await wal.append("other", {"n": 3})
            fourth = await wal.append("other", {"n": 4})
            assert [e.id for e in await wal.pending("game_recorded", limit=1)] == [first]
            assert [e.id for e in await wal.pending()] == [first, second, third, fourth]
            await wal.commit(first)
            await wal.rollback(second, reason="not needed")
            assert await wal.fail(third, error="try again") is EntryState.PENDING
            assert (await wal.get(first)) is not None
            await wal.state_set("term", {"term": 3})
            assert await wal.state_get("term") == {"term": 3}
            assert (await wal.stats()).pending == 2
            assert await wal.cleanup(older_than_s=0) == 2

            async def recovered(entry: WalEntry) -> None:
                assert entry.entry_type == "other"

            result = await wal.recover({"other": recovered})
            assert result.recovered == 2
        async with WriteAheadLog(path, config=FAST) as wal:  # reopened: the schema checks
            assert await wal.pending() == []
    bad = [
        (sql, params)
        for sql, params in executed
        if not isinstance(params, Mapping) and named_placeholders(sql)
    ]
    assert bad == []
    pages = [params for sql, params in executed if "WHERE state = 'pending' AND id >" in sql]
    assert len(pages) >= 3, "the pending reads (by type, all, recovery's pages) ran"


def _string_constants(path: Path) -> Iterable[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_product_sql_uses_numbered_placeholders() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text.strip()[:80]}"
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, text in _string_constants(path)
        if _NUMBERED.search(_LITERALS.sub("''", text))
    ]
    assert found == []
