"""Small contract points of a running daemon: what it creates is not world-readable (the umask
`shoal serve` sets, whatever the caller's), and a wrong metrics bearer token says so."""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

from tests.node.test_openapi_fuzz import _daemon


def test_files_the_daemon_creates_are_not_world_readable(tmp_path: Path) -> None:
    game = {
        "game_id": "g1",
        "created_at": 1.0,
        "board_type": "hex8",
        "num_players": 2,
        "winner": 1,
        "moves": ["a1"],
    }
    with _daemon(tmp_path, "--insecure", umask=0) as (_, port):  # a careless caller's umask
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/records/games",
            data=json.dumps([game]).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["accepted"] == 1
    created = [
        Path(root) / name
        for root, dirs, files in os.walk(tmp_path / "data")
        for name in [*dirs, *files]
    ]
    names = {path.name for path in created}
    assert "games.db" in names, names
    for path in created:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode & 0o007 == 0, f"{path} is {oct(mode)}: readable or writable by anyone"


def test_a_wrong_metrics_bearer_token_says_so(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123456789abcdef")
    secret.chmod(0o600)
    with _daemon(tmp_path, "--secret-file", str(secret)) as (_, port):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer nope"}
        )
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as exc:
            status, body = exc.code, json.loads(exc.read())
        else:
            raise AssertionError("a wrong token was accepted")
    assert status == 401
    assert "metrics" in body["reason"]
    assert "token" in body["reason"]
    assert "signature headers" not in body["reason"]
