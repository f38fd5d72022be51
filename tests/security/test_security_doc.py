"""docs/security.md states each limit of the unauthenticated surface as it is in code: the table
of its budgets names each constant and its value, and a drifted value (or constant) fails."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import node.connections
import node.limits

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
ROW = re.compile(r"^\| (?P<what>[^|]+) \| `(?P<constant>[\w.]+)` \| (?P<value>[^|]+) \| [^|]+ \|$")
UNITS = {"s": 1, "KiB": 1024, "MiB": 1024 * 1024}


def _documented() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Budgets of the unauthenticated surface", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = ROW.match(line)
        if found is not None:
            rows[found["constant"]] = found["value"].strip()
    return rows


def _number(value: str) -> float:
    number, _, unit = value.partition(" ")
    return float(number) * UNITS.get(unit, 1)


def _constant(dotted: str) -> float:
    module, _, name = dotted.rpartition(".")
    value = getattr(importlib.import_module(module), name)
    assert isinstance(value, int | float), dotted
    return float(value)


def test_every_documented_limit_is_the_constant_in_code() -> None:
    rows = _documented()
    assert len(rows) >= 15, rows
    drifted = {
        constant: (value, _constant(constant))
        for constant, value in rows.items()
        if _number(value) != _constant(constant)
    }
    assert not drifted, f"docs/security.md (value) differs from the code (constant): {drifted}"


def test_every_limit_in_code_is_documented() -> None:
    documented = set(_documented())
    for module in (node.limits, node.connections):
        for name in dir(module):
            if name.isupper() and isinstance(getattr(module, name), int | float):
                if name == "MAX_ADDRESSES_NOTED":
                    continue  # how many addresses are logged, not a budget
                assert f"{module.__name__}.{name}" in documented, name
