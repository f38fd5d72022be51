"""Every peer call of node/, sync/ and health/ goes through net: none of their modules opens an
aiohttp ClientSession, calls urllib.request, or signs with config's client middlewares itself.
ALLOWED names each module that may, and why (empty: every call site is converted)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("node", "sync", "health")
ALLOWED: dict[str, str] = {}
"""`path: what` -> why it cannot use net yet."""
FORBIDDEN_CALLS = frozenset({"ClientSession", "TCPConnector", "urlopen", "Request"})
FORBIDDEN_MODULES = frozenset({"urllib.request"})
FORBIDDEN_NAMES = frozenset({"signing_middleware", "peer_middlewares", "cluster_middleware"})


def _direct_peer_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = {alias.name for alias in node.names}
            if module in FORBIDDEN_MODULES or names & FORBIDDEN_MODULES:
                found.append(f"line {node.lineno}: imports urllib.request")
            if names & FORBIDDEN_NAMES:
                found.append(f"line {node.lineno}: imports {sorted(names & FORBIDDEN_NAMES)}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            if name in FORBIDDEN_CALLS and owner in ("aiohttp", "urllib.request", ""):
                if name == "Request" and owner != "urllib.request":
                    continue
                found.append(f"line {node.lineno}: {ast.unparse(func)}(...)")
    return found


def test_no_peer_call_bypasses_the_peer_client() -> None:
    offenders = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for hit in _direct_peer_calls(path):
                where = f"{path.relative_to(ROOT)}: {hit.split(': ', 1)[1]}"
                if where not in ALLOWED:
                    offenders[f"{path.relative_to(ROOT)} {hit.split(':')[0]}"] = where
    assert offenders == {}, (
        "peer calls outside net (use net.PeerClient / BlockingPeerClient, or add to ALLOWED "
        f"with a reason): {sorted(offenders)}"
    )


def test_the_check_finds_a_direct_session(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import aiohttp\nimport urllib.request\nfrom config import signing_middleware\n"
        "s = aiohttp.ClientSession()\nurllib.request.urlopen('http://x')\n",
        encoding="utf-8",
    )
    assert [hit.split(":")[0] for hit in _direct_peer_calls(module)] == [
        "line 2",
        "line 3",
        "line 4",
        "line 5",
    ]
