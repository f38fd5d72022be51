"""Crash safety: a record server is SIGKILLed while producers write; every acknowledged record is
present exactly once after it restarts on the same database.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.sync.record_fixtures import game

SERVER = Path(__file__).with_name("record_server.py")
ROOT = SERVER.parents[2]
ROUNDS = 20
PRODUCERS = 4
BATCH = 40


class ServerProcess:
    """tests/sync/record_server.py in a child process."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}/v1/records/games"

    @classmethod
    async def start(cls, data_dir: Path) -> ServerProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(SERVER), str(data_dir), cwd=ROOT, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        try:
            async with asyncio.timeout(20):
                line = await process.stdout.readline()
        except BaseException:
            process.kill()
            await process.wait()
            raise
        assert line.startswith(b"PORT "), line
        return cls(process, int(line.split()[1]))

    async def stop(self, kill: bool) -> None:
        if self.process.returncode is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
        await self.process.wait()
        assert self.process.stdout is not None
        await self.process.stdout.read()


@contextlib.asynccontextmanager
async def server_process(data_dir: Path) -> AsyncIterator[list[ServerProcess]]:
    """A one-element list holding the running server; whatever is in it is stopped at the end."""
    holder = [await ServerProcess.start(data_dir)]
    try:
        yield holder
    finally:
        await holder[0].stop(kill=True)


async def produce(
    session: aiohttp.ClientSession, url: str, prefix: str, acked: dict[str, Any]
) -> None:
    """Post batches of new games until the server dies; remember what it acknowledged."""
    sequence = 0
    while True:
        batch = [
            game(0, game_id=f"{prefix}-{sequence + i}", created_at=random.uniform(0, 1e6))
            for i in range(BATCH)
        ]
        sequence += BATCH
        try:
            async with session.post(url, json=batch) as response:
                if response.status != 200:
                    return
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError):
            return
        assert body == {"accepted": BATCH, "duplicates": 0}
        for record in batch:
            acked[record["game_id"]] = record


def stored_games(db: Path) -> dict[str, sqlite3.Row]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM games").fetchall()
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    games = {row["game_id"]: row for row in rows}
    assert len(games) == len(rows)
    return games


@pytest.mark.slow
async def test_acknowledged_records_survive_sigkill(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    db = data_dir / "games" / "games.db"
    acked: dict[str, Any] = {}
    rng = random.Random(11)
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        server_process(data_dir) as holder,
        aiohttp.ClientSession(timeout=timeout) as session,
    ):
        for round_number in range(ROUNDS):
            running = holder[0]
            before = len(acked)
            producers = [
                asyncio.create_task(produce(session, running.url, f"r{round_number}p{p}", acked))
                for p in range(PRODUCERS)
            ]
            await asyncio.sleep(rng.uniform(0.05, 0.25))
            await running.stop(kill=True)
            await asyncio.gather(*producers)
            holder[0] = await ServerProcess.start(data_dir)
            stored = stored_games(db)
            missing = set(acked) - set(stored)
            assert not missing, f"round {round_number}: {len(missing)} acknowledged games lost"
            if len(acked) > before:
                # re-sending what was acknowledged before the crash only counts duplicates
                again = [acked[key] for key in list(acked)[before : before + BATCH]]
                async with session.post(holder[0].url, json=again) as response:
                    assert await response.json() == {"accepted": 0, "duplicates": len(again)}
        await holder[0].stop(kill=False)
    stored = stored_games(db)
    assert set(acked) <= set(stored)
    assert len(acked) > ROUNDS * BATCH
    for key in rng.sample(sorted(acked), 50):
        assert stored[key]["created_at"] == acked[key]["created_at"]
        assert stored[key]["moves"] == '["m0","e2e4","e7e5"]'
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
