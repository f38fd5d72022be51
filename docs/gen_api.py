"""The route table of docs/http-api.md, generated from a live node's OpenAPI document.

`python docs/gen_api.py` starts a node on loopback (port 0, a temporary data dir, no mDNS),
reads `GET /v1/openapi.json` and rewrites the table between the page's markers;
`python docs/gen_api.py --check` exits 1 when the page differs. tests/test_docs.py runs the check.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().with_name("http-api.md")
BEGIN = "<!-- routes:begin -->"
END = "<!-- routes:end -->"
METHODS = ("get", "head", "post", "put", "patch", "delete")


async def live_document() -> dict[str, Any]:
    """The OpenAPI document a node with default settings serves (no secret, loopback)."""
    from aiohttp import ClientSession

    from config import load_settings
    from node.daemon import NodeDaemon

    with tempfile.TemporaryDirectory(prefix="shoal-docs-") as tmp:
        flags = {"data_dir": Path(tmp), "node_id": "docs", "port": 0, "mdns": False}
        settings = load_settings(env={}, flags=flags).settings
        async with NodeDaemon(settings) as daemon:
            url = f"http://127.0.0.1:{daemon.port}/v1/openapi.json"
            async with ClientSession() as session, session.get(url) as response:
                response.raise_for_status()
                document: dict[str, Any] = await response.json()
    return document


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path, operation) of every operation, in path then method order."""
    found = []
    for path in sorted(document["paths"]):
        item = document["paths"][path]
        for method in METHODS:
            if method in item:
                found.append((method.upper(), path, item[method]))
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def route_table(document: dict[str, Any]) -> str:
    """One row per operation: method, path, summary, who may call it, answers."""
    rows = ["| method | path | what it does | callers | answers |", "|---|---|---|---|---|"]
    for method, path, operation in operations(document):
        callers = ", ".join(operation.get("x-shoal-callers", ()))
        if operation.get("x-shoal-forwarded"):
            callers += " (relayed by a node)"
        answers = ", ".join(sorted(operation.get("responses", {})))
        summary = _cell(operation.get("summary", ""))
        rows.append(f"| `{method}` | `{path}` | {summary} | {callers} | {answers} |")
    return "\n".join(rows)


def render_page(text: str, document: dict[str, Any]) -> str:
    """`text` with the table between the markers replaced by the one `document` gives."""
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise ValueError(f"{PAGE.name}: marker {BEGIN} not found")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise ValueError(f"{PAGE.name}: marker {END} not found")
    return f"{head}{BEGIN}\n{route_table(document)}\n{END}{tail}"


def main(argv: list[str]) -> int:
    check = "--check" in argv[1:]
    text = PAGE.read_text(encoding="utf-8")
    rendered = render_page(text, asyncio.run(live_document()))
    if rendered == text:
        return 0
    if check:
        print(f"{PAGE} is out of date: run python docs/gen_api.py", file=sys.stderr)
        return 1
    PAGE.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
