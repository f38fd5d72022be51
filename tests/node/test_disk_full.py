"""A full disk end to end on a small tmpfs: 507 with path and free bytes, the disk component
unhealthy at the first failed write, the CLI printing the node's reason, writes resuming."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from typer.testing import CliRunner

from node.cli.records import records_app
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings
from tests.sync.record_fixtures import game

MIB = 1024 * 1024


@contextmanager
def small_tmpfs(mount_point: Path, size_mib: int) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


class DaemonThread:
    """A NodeDaemon run by an event loop in a thread, so the test thread can run the CLI."""

    def __init__(self, daemon: NodeDaemon) -> None:
        self.daemon = daemon
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="disk-full-daemon")

    def __enter__(self) -> DaemonThread:
        self._thread.start()
        self.call(self.daemon.start())
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.call(self.daemon.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.daemon.port}"


async def post_games(url: str, games: list[dict[str, Any]]) -> tuple[int, Any]:
    async with (
        ClientSession() as session,
        session.post(f"{url}/v1/records/games", json=games) as response,
    ):
        return response.status, await response.json()


async def get_json(url: str) -> tuple[int, Any]:
    async with ClientSession() as session, session.get(url) as response:
        return response.status, await response.json()


def fill(path: Path, leave_bytes: int) -> None:
    """Write `path` until the filesystem has about `leave_bytes` free."""
    st = os.statvfs(path.parent)
    size = max(0, st.f_bavail * st.f_frsize - leave_bytes)
    with path.open("wb") as handle:
        handle.write(b"\0" * size)


def big_games(start: int, count: int) -> list[dict[str, Any]]:
    return [game(start + i, moves=["x" * 4000] * 16) for i in range(count)]


def test_full_disk_answers_507_health_unhealthy_cli_reason_and_writes_resume(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "small", 24) as mount_point:
        settings = test_settings(mount_point, "full")
        with DaemonThread(NodeDaemon(settings)) as node:
            status, body = node.call(post_games(node.url, big_games(0, 10)))
            assert status == 200
            acknowledged = body["accepted"]
            filler = mount_point / "filler"
            fill(filler, leave_bytes=256 * 1024)
            answers = []
            for batch in range(40):
                status, body = node.call(post_games(node.url, big_games(1000 + 100 * batch, 8)))
                answers.append(status)
                if status != 200:
                    break
                acknowledged += body["accepted"]
            assert status == 507, answers
            assert body["error"] == "insufficient_storage"
            assert body["status"] == 507
            assert body["path"].endswith("games.db")
            assert isinstance(body["free_bytes"], int)
            assert body["path"] in body["reason"]
            assert f"{body['free_bytes']} bytes free" in body["reason"]

            # at once: no periodic check ran in between (the disk check runs every 30 s)
            health_status, health = node.call(get_json(f"{node.url}/v1/health"))
            disk = {c["name"]: c for c in health["components"]}["disk"]
            assert disk["status"] == "unhealthy", disk
            assert "games.db failed" in disk["message"]
            assert health_status == 503

            lines = tmp_path / "more.jsonl"
            lines.write_text("".join(json.dumps(g) + "\n" for g in big_games(90_000, 8)))
            result = CliRunner().invoke(
                records_app,
                ["import", "games", str(lines), "--node", node.url],
                env={"SHOAL_CONFIG": "", "SHOAL_SECRET_FILE": ""},
            )
            assert result.exit_code == 1
            assert "507" in result.stderr
            assert "bytes free" in result.stderr, result.stderr
            assert "games.db" in result.stderr, result.stderr

            filler.unlink()  # space returns: writes resume by themselves
            status, body = node.call(post_games(node.url, big_games(50_000, 5)))
            assert status == 200, body
            acknowledged += body["accepted"]
            _, store = node.call(get_json(f"{node.url}/v1/records/games/status"))
            assert store["count"] == acknowledged
