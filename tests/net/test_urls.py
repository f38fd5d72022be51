"""Peer URLs come from net/ only (net.build.peer_url / local_url / base_url), IPv6 in brackets.

The scan walks every product module outside net/ and fails on a URL put together by hand: an
f-string whose literal text ends in an open `http://...` or `https://...` URL (or is a bare
`://`) right before an interpolated host or port, or a `+` / `%` whose left side is such a
string. Docstrings and messages that only name a scheme pass. The few places that may not
import net, or make a URL that is not a peer's, are listed in ALLOWED with the reason.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from net import local_url, peer_url

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("config", "wal", "health", "sync", "node", "shoal")
OPEN_URL = re.compile(r"https?://\S*$")

ALLOWED: dict[tuple[str, int], str] = {
    ("config/settings.py", 1): "config sits below net in the layers (config <- net): "
    "NodeSettings.local_url brackets an IPv6 bind itself",
    ("config/tls/client.py", 1): "config sits below net: the TLS seam re-schemes a URL it was "
    "given (http:// -> https://), it builds no host:port",
    ("node/runs/results.py", 1): "not a peer: the AWS S3 endpoint of a region "
    "(https://s3.REGION.amazonaws.com)",
    ("shoal/_daemon.py", 2): "the public package imports no internal package "
    "(tests/shoal/test_import_safety.py): the local daemon URL default "
    "(http://127.0.0.1:SHOAL_P2P_PORT) and the https re-scheme of a URL it was given",
}
"""(module, how many hand-made URLs it keeps) -> why it may."""


def _scheme_end(node: ast.expr) -> bool:
    """Whether `node` is a literal string that ends in a URL still open for what comes next
    (`http://`, `https://10.0.0.7:`, a bare `://` after an interpolated scheme)."""
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
        return False
    return OPEN_URL.search(node.value) is not None or node.value == "://"


def _hand_made(tree: ast.AST) -> list[int]:
    """The lines of `tree` that join a scheme to an interpolated or concatenated host."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            pieces = node.values
            if any(
                _scheme_end(piece) and isinstance(after, ast.FormattedValue)
                for piece, after in itertools.pairwise(pieces)
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
            left = node.left
            literal = isinstance(left, ast.Constant) and isinstance(left.value, str)
            if _scheme_end(left) or (
                literal and isinstance(node.op, ast.Mod) and "://%" in str(left.value)
            ):
                lines.append(node.lineno)
    return sorted(set(lines))


def hand_made_urls() -> dict[str, list[int]]:
    """Every product module outside net/ that builds a URL by hand, with the lines."""
    found = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = _hand_made(ast.parse(path.read_text(), str(path)))
            if lines:
                found[path.relative_to(ROOT).as_posix()] = lines
    return found


def test_no_product_module_outside_net_builds_a_peer_url_by_hand() -> None:
    found = hand_made_urls()
    allowed = {module: count for module, count in ALLOWED}
    unexpected = {
        module: lines for module, lines in found.items() if len(lines) > allowed.get(module, 0)
    }
    assert not unexpected, (
        "build a peer's URL with net.peer_url(host, port, tls=...) (or net.local_url for this "
        f"host's own daemon), which brackets IPv6 literals; hand-made at {unexpected}"
    )
    stale = {module for module in allowed if module not in found}
    assert not stale, f"ALLOWED names modules that no longer build a URL: {sorted(stale)}"
    total = sum(len(lines) for lines in found.values())
    print(f"hand-made URLs outside net/: {total} in {len(found)} modules (all in ALLOWED)")


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('f"http://{host}:{port}"', True),
        ('f"https://{host}:{port}/v1"', True),
        ('f"{scheme}://{host}:{port}"', True),
        ('"http://" + host', True),
        ('"http://%s:%d" % (host, port)', True),
        ('f"--node http://127.0.0.1:{port}"', True),
        ('"http://127.0.0.1:8770"', False),
        ('f"must start with http:// or https://"', False),
        ('f"{url!r} must start with http:// or https://"', False),
        ('f"s3://{bucket}/{key}"', False),
        ('peer_url(host, port) + "/v1/health"', False),
    ],
)
def test_the_scan_tells_a_hand_made_url_from_a_message(source: str, caught: bool) -> None:
    assert bool(_hand_made(ast.parse(source))) is caught


@pytest.mark.parametrize(
    ("host", "port", "tls", "url"),
    [
        ("10.0.0.7", 8770, False, "http://10.0.0.7:8770"),
        ("10.0.0.7", "8770", True, "https://10.0.0.7:8770"),
        ("::1", 8770, False, "http://[::1]:8770"),
        ("fd00::2", 8770, True, "https://[fd00::2]:8770"),
        ("[::1]", 8770, False, "http://[::1]:8770"),
        ("::ffff:10.0.0.7", 1, False, "http://[::ffff:10.0.0.7]:1"),
        ("fe80::1%eth0", 8770, False, "http://[fe80::1%eth0]:8770"),
        ("node-a", 8770, False, "http://node-a:8770"),
        ("node-a.example.org", 443, True, "https://node-a.example.org:443"),
    ],
)
def test_peer_url_brackets_ipv6_literals_only(host: str, port: int, tls: bool, url: str) -> None:
    assert peer_url(host, port, tls=tls) == url


@pytest.mark.parametrize(
    ("bind", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8770"),
        ("", "http://127.0.0.1:8770"),
        ("::", "http://[::1]:8770"),
        ("::1", "http://[::1]:8770"),
        ("10.0.0.7", "http://10.0.0.7:8770"),
    ],
)
def test_local_url_reaches_a_wildcard_bind_on_loopback(bind: str, url: str) -> None:
    assert local_url(bind, 8770) == url
