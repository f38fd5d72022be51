"""What the HTTP surface costs, printed and bounded: the lines of the route modules and of the
modules that declare, document and check routes, the number of operations a node serves, and
the hand-written `"type": "object"` JSON Schema literals left in the product code (at most 5,
each with a comment giving its reason: everything else is generated from models)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from node.daemon import NodeDaemon
from tests.node.daemons import test_settings

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("config", "net", "wal", "health", "sync", "node")
ROUTE_MODULES = (
    "node/routes.py",
    "node/*/routes.py",
    "sync/*/routes.py",
    "sync/files/piece_routes.py",
    "node/sync_routes.py",
)
"""Where handlers and their declarations live."""
MACHINERY = ("config/declare.py", "node/openapi.py", "node/component.py", "node/access.py")
"""Declarations, the document built from them, endpoints, and the access rules."""
WIRE_MODULES = (
    "node/*/wire.py",
    "sync/*/wire.py",
    "node/training/models.py",
    "sync/records/operations.py",
)
"""The routes' paths, bodies, queries and answers as models (what the docs modules held)."""
NOT_HTTP = ("node/membership/wire.py",)
"""Named like a wire module but not HTTP: the gossip datagrams' codec (UDP)."""
SCHEMA_LITERAL = re.compile(r"""["']type["']\s*:\s*["']object["']""")
MAX_SCHEMA_LITERALS = 5
MAX_LINES_PER_OPERATION = 80
"""Before the routes were declared once, 76 operations cost about 5,300 lines (route modules
3,750, docs modules and the OpenAPI module 1,561)."""


def _lines(patterns: tuple[str, ...]) -> dict[str, int]:
    found = sorted({path for pattern in patterns for path in ROOT.glob(pattern)})
    found = [path for path in found if str(path.relative_to(ROOT)) not in NOT_HTTP]
    return {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in found
    }


def schema_literals() -> list[tuple[str, int, bool]]:
    """(file, line, has a reason) of every `"type": "object"` literal in the product code; the
    reason is a `# schema literal:` comment on one of the three lines above."""
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, start=1):
                if SCHEMA_LITERAL.search(line):
                    above = lines[max(0, number - 4) : number - 1]
                    reason = any("# schema literal:" in text for text in above)
                    found.append((str(path.relative_to(ROOT)), number, reason))
    return found


async def _operations(tmp_path: Path) -> int:
    async with NodeDaemon(test_settings(tmp_path, "surface")) as daemon:
        url = f"http://127.0.0.1:{daemon.port}/v1/openapi.json"
        async with ClientSession() as session, session.get(url) as response:
            document: dict[str, Any] = await response.json()
    return sum(len(item) for item in document["paths"].values())


async def test_the_http_surface_is_counted_and_bounded(tmp_path: Path) -> None:
    routes, machinery, wire = _lines(ROUTE_MODULES), _lines(MACHINERY), _lines(WIRE_MODULES)
    operations = await _operations(tmp_path)
    literals = schema_literals()
    total = sum(routes.values()) + sum(machinery.values()) + sum(wire.values())
    print(
        f"HTTP surface: {operations} operations; route modules {sum(routes.values())} lines "
        f"in {len(routes)} files, declaration machinery {sum(machinery.values())}, wire models "
        f"{sum(wire.values())}: {total} lines, {total / operations:.0f} per operation; "
        f"{len(literals)} schema literals"
    )
    for name, count in {**routes, **machinery, **wire}.items():
        print(f"  {count:5d} {name}")
    docs = sorted(
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in (ROOT / package).rglob("*docs.py")
    )
    assert docs == [], f"documentation modules beside the declarations: {docs}"
    assert operations >= 70
    assert total <= MAX_LINES_PER_OPERATION * operations
    assert len(literals) <= MAX_SCHEMA_LITERALS, literals
    assert all(reason for _, _, reason in literals), [f for f in literals if not f[2]]
