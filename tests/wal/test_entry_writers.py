"""No built-in WAL entry type without a writer: each is appended by the operation it names
(the tests of those operations check that they do: tests/sync/test_coordinator.py for
`sync_started`, tests/node/test_daemon_sync.py for `sync_completed`)."""

from __future__ import annotations

import ast
from pathlib import Path

import wal
import wal.entry

ROOT = Path(__file__).resolve().parents[2]
WRITERS = ("sync", "node")


def _appended_names() -> set[str]:
    """Names passed as the first argument of any `.append(...)` call in the writer packages."""
    names: set[str] = set()
    for package in WRITERS:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "append"
                    and node.args
                    and isinstance(node.args[0], ast.Name)
                ):
                    names.add(node.args[0].id)
    return names


def test_every_builtin_entry_type_has_a_writer() -> None:
    constants = {
        name: value
        for name, value in vars(wal.entry).items()
        if name.isupper() and isinstance(value, str) and value in wal.BUILTIN_ENTRY_TYPES
    }
    assert set(constants.values()) == wal.BUILTIN_ENTRY_TYPES
    unwritten = sorted(name for name in constants if name not in _appended_names())
    assert not unwritten, f"built-in WAL entry types nobody appends: {unwritten}"
