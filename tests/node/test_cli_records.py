"""`shoal records status|import|export` against a real record server running in a thread."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from node.cli.records import records_app
from sync import RecordStores, StoreOptions, record_routes
from tests.sync.record_fixtures import game

runner = CliRunner()


class ServerThread:
    """Record stores and their routes served on 127.0.0.1:0 by an event loop in a thread."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="records-test-server")

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(20)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test thread
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        stores = RecordStores(self.data_dir, options=StoreOptions(idle_checkpoint_s=0.2))
        app = web.Application()
        app.add_routes(record_routes(stores, "cli-node"))
        async with stores:
            runner = web.AppRunner(app, handle_signals=False)
            await runner.setup()
            try:
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
                self._ready.set()
                await self._stop.wait()
            finally:
                await runner.cleanup()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[str]:
    with ServerThread(tmp_path / "node") as server:
        yield server.url


def invoke(*args: str) -> Any:
    return runner.invoke(records_app, list(args), env={"SHOAL_CONFIG": "", "SHOAL_SECRET_FILE": ""})


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_import_then_status_then_export(node: str, tmp_path: Path) -> None:
    games = write_lines(tmp_path / "games.jsonl", [json.dumps(game(i)) for i in range(25)])
    result = invoke("import", "games", str(games), "--node", node, "--batch-size", "10")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary == {
        "store": "games",
        "file": str(games),
        "lines": 25,
        "sent": 25,
        "accepted": 25,
        "duplicates": 0,
        "bad_lines": 0,
    }
    assert "games: 20 records sent" in result.stderr  # plain progress lines off a terminal

    again = invoke("import", "games", str(games), "--node", node)
    assert json.loads(again.stdout.strip())["duplicates"] == 25

    status = invoke("status", "--node", node, "--json")
    assert status.exit_code == 0, status.output
    counts = {s["store"]: s["count"] for s in json.loads(status.stdout)["stores"]}
    assert counts == {"games": 25, "rollouts": 0}
    table = invoke("status", "--node", node)
    assert "games" in table.stdout
    assert "rollouts" in table.stdout

    exported = invoke(
        "export", "games", "--since", "1700000020", "--node", node, "--page-size", "2"
    )
    assert exported.exit_code == 0, exported.output
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert records == [{**game(i), "source_node": "cli-node"} for i in range(20, 25)]
    assert "exported 5 games records" in exported.stderr
    hex_only = invoke("export", "games", "--node", node, "--filter", "board_type=hex8")
    assert len(hex_only.stdout.splitlines()) == 12


def test_bad_lines_are_reported_with_their_numbers_and_skipped(node: str, tmp_path: Path) -> None:
    lines = [json.dumps(game(0)), "{oops", "", "[1, 2]", json.dumps(game(1))]
    result = invoke(
        "import", "games", str(write_lines(tmp_path / "g.jsonl", lines)), "--node", node
    )
    assert result.exit_code == 1
    assert "g.jsonl:2: malformed JSON" in result.stderr
    assert "g.jsonl:4: expected a JSON object" in result.stderr
    assert "2 bad line(s) were skipped (first: line 2)" in result.stderr
    summary = json.loads(result.stdout.strip())
    assert (summary["lines"], summary["accepted"], summary["bad_lines"]) == (5, 2, 2)


def test_a_rejected_record_names_its_line_and_exits_1(node: str, tmp_path: Path) -> None:
    lines = [json.dumps(game(i)) for i in range(6)]
    lines[4] = json.dumps(game(4, num_players="two"))
    lines[5] = json.dumps(game(5, winner="nobody"))
    lines[1] = json.dumps({**game(1), "game_id": ""})
    path = write_lines(tmp_path / "g.jsonl", lines)
    result = invoke("import", "games", str(path), "--node", node, "--batch-size", "3")
    assert result.exit_code == 1
    assert f"{path}:2: game_id: the key must not be empty" in result.stderr
    assert f"{path}:5: num_players: expected integer" in result.stderr
    assert f"{path}:6: winner: expected integer" in result.stderr
    assert "3 bad line(s) were skipped (first: line 2); every other line was ingested" in (
        result.stderr
    )
    summary = json.loads(result.stdout.strip())
    assert (summary["accepted"], summary["bad_lines"]) == (3, 3)  # the good ones of each batch
    unknown = invoke("import", "nope", str(path), "--node", node)
    assert unknown.exit_code == 1
    assert "unknown record store 'nope'" in unknown.stderr


def test_unreadable_file_exits_2_and_unreachable_node_exits_1(tmp_path: Path) -> None:
    result = invoke("import", "games", str(tmp_path / "missing.jsonl"), "--node", "http://x")
    assert result.exit_code == 2
    assert "missing.jsonl: cannot read" in result.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status = invoke("status", "--node", f"http://127.0.0.1:{port}")
    assert status.exit_code == 1
    assert "cannot reach the node" in status.stderr
    export = invoke("export", "games", "--node", f"http://127.0.0.1:{port}")
    assert export.exit_code == 1
    bad_filter = invoke("export", "games", "--node", "http://x", "--filter", "oops")
    assert bad_filter.exit_code == 2
