"""Crash safety of the real daemon: `python -m node serve` is SIGKILLed while producers post game
records; after each restart on the same data dir and port every acknowledged record is there once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 20
PRODUCERS = 4
BATCH = 25
MAX_GET_KEYS = 1000
MAX_QUERY_BYTES = 7000
START_TIMEOUT_S = 20.0
SEED = int(os.environ.get("SHOAL_CRASH_SEED", random.SystemRandom().randrange(2**32)))

Record = dict[str, Any]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env() -> dict[str, str]:
    """This environment without SHOAL_* settings, so only the command-line flags configure."""
    return {name: value for name, value in os.environ.items() if not name.startswith("SHOAL_")}


class DaemonProcess:
    """`python -m node serve` in a child process, its output appended to `log_path`."""

    def __init__(self, process: asyncio.subprocess.Process, port: int, log_path: Path) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{port}"
        self.records_url = f"{self.base}/v1/records/games"
        self.log_path = log_path

    @classmethod
    async def start(
        cls, data_dir: Path, port: int, log_path: Path, session: aiohttp.ClientSession
    ) -> DaemonProcess:
        """Start the daemon and return once GET /v1/health answers; fail if it exits first."""
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "node",
                "serve",
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
                "--node-id",
                "n1",
                "--no-mdns",
                cwd=ROOT,
                env=child_env(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        daemon = cls(process, port, log_path)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while not await daemon.answers_health(session):
                    if process.returncode is not None:
                        pytest.fail(
                            f"seed {SEED}: daemon exited with {process.returncode} on start-up:\n"
                            + daemon.log_tail()
                        )
                    await asyncio.sleep(0.02)
        except BaseException:
            await daemon.stop(kill=True)
            raise
        return daemon

    async def answers_health(self, session: aiohttp.ClientSession) -> bool:
        try:
            async with session.get(
                f"{self.base}/v1/health", timeout=aiohttp.ClientTimeout(total=1)
            ) as response:
                await response.read()
                return True
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def stop(self, kill: bool) -> int:
        if self.process.returncode is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
        return await self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.asynccontextmanager
async def daemon_process(
    data_dir: Path, port: int, log_path: Path, session: aiohttp.ClientSession
) -> AsyncIterator[list[DaemonProcess]]:
    """A one-element list holding the running daemon; whatever is in it is killed at the end."""
    holder = [await DaemonProcess.start(data_dir, port, log_path, session)]
    try:
        yield holder
    finally:
        await holder[0].stop(kill=True)


def game(game_id: str, rng: random.Random) -> Record:
    return {
        "game_id": game_id,
        "created_at": rng.uniform(1.6e9, 1.8e9),
        "board_type": rng.choice(("square8", "hex8")),
        "num_players": rng.randint(2, 4),
        "winner": rng.choice((None, 0, 1)),
        "moves": [f"m{rng.randrange(1000)}" for _ in range(rng.randint(1, 6))],
    }


async def post(session: aiohttp.ClientSession, url: str, batch: list[Record]) -> tuple[int, Any]:
    async with session.post(url, json=batch) as response:
        return response.status, await response.json(content_type=None)


async def produce(
    session: aiohttp.ClientSession,
    url: str,
    prefix: str,
    rng: random.Random,
    acked: list[list[Record]],
    in_flight: list[list[Record]],
) -> None:
    """Post batches of new games until the daemon dies; remember which batches it acknowledged."""
    sequence = 0
    while True:
        batch = [game(f"{prefix}-{sequence + i}", rng) for i in range(BATCH)]
        sequence += BATCH
        status = 503
        while status == 503:  # the store is busy and wrote nothing: post the same batch again
            try:
                status, body = await post(session, url, batch)
            except (aiohttp.ClientError, TimeoutError):
                in_flight.append(batch)
                return
        assert status == 200, f"seed {SEED}: {status} {body}"
        assert body == {"accepted": BATCH, "duplicates": 0}, f"seed {SEED}: {body}"
        acked.append(batch)


def get_chunks(keys: list[str]) -> list[list[str]]:
    """`keys` cut into /get requests of at most MAX_GET_KEYS keys and MAX_QUERY_BYTES of query.

    The daemon accepts request lines up to 256 KiB (1000 long keys fit); the byte bound only
    keeps each verification request small.
    """
    chunks: list[list[str]] = [[]]
    size = 0
    for key in keys:
        cost = len("key=&") + len(key)
        if len(chunks[-1]) == MAX_GET_KEYS or size + cost > MAX_QUERY_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(key)
        size += cost
    return [chunk for chunk in chunks if chunk]


async def fetch_games(
    session: aiohttp.ClientSession, url: str, keys: list[str]
) -> dict[str, list[Record]]:
    """Every stored copy of each of `keys`, through GET /v1/records/games/get."""
    found: dict[str, list[Record]] = {}
    for chunk in get_chunks(keys):
        async with session.get(f"{url}/get", params=[("key", key) for key in chunk]) as response:
            assert response.status == 200, f"seed {SEED}: {await response.text()}"
            body = await response.json()
        for record in body["records"]:
            found.setdefault(record["game_id"], []).append(record)
        assert set(body["missing"]) == set(chunk) - set(found), f"seed {SEED}: missing list"
    return found


def assert_stored_once(found: dict[str, list[Record]], batches: list[list[Record]]) -> None:
    for batch in batches:
        for record in batch:
            copies = found.get(record["game_id"], [])
            assert len(copies) == 1, f"seed {SEED}: {record['game_id']}: {len(copies)} copies"
            stored = copies[0]
            for field in ("created_at", "board_type", "num_players", "winner", "moves"):
                assert stored[field] == record[field], f"seed {SEED}: {record['game_id']}.{field}"


async def resend(
    session: aiohttp.ClientSession, url: str, batch: list[Record], acknowledged: bool
) -> bool:
    """Post `batch` again: all duplicates if it was acknowledged, else all or nothing new.

    Returns whether the batch had been committed before (all duplicates).
    """
    status, body = await post(session, url, batch)
    assert status == 200, f"seed {SEED}: re-send got {status} {body}"
    everything_duplicate = {"accepted": 0, "duplicates": len(batch)}
    if acknowledged:
        assert body == everything_duplicate, f"seed {SEED}: re-sent acknowledged batch: {body}"
    else:
        everything_new = {"accepted": len(batch), "duplicates": 0}
        assert body in (everything_duplicate, everything_new), f"seed {SEED}: partial: {body}"
    return bool(body == everything_duplicate)


def stored_game_ids(db: Path) -> list[str]:
    """Every game_id row of the games database, after PRAGMA integrity_check is ok."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f"seed {SEED}"
        return [row[0] for row in conn.execute("SELECT game_id FROM games")]


@pytest.mark.slow
async def test_daemon_keeps_acknowledged_records_across_sigkill(tmp_path: Path) -> None:
    print(f"seed {SEED} (set SHOAL_CRASH_SEED to repeat the choices)")
    rng = random.Random(SEED)
    data_dir = tmp_path / "data"
    log_path = tmp_path / "daemon.log"
    port = free_port()
    acked: list[list[Record]] = []
    committed_unacked = 0
    acked_per_round: list[int] = []
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        daemon_process(data_dir, port, log_path, session) as holder,
    ):
        for round_number in range(ROUNDS):
            url = holder[0].records_url
            round_acked: list[list[Record]] = []
            in_flight: list[list[Record]] = []
            producers = [
                asyncio.create_task(
                    produce(
                        session,
                        url,
                        f"r{round_number}p{p}",
                        random.Random(rng.random()),
                        round_acked,
                        in_flight,
                    )
                )
                for p in range(PRODUCERS)
            ]
            try:
                wanted = rng.randint(1, 3 * PRODUCERS)
                async with asyncio.timeout(10):
                    while len(round_acked) < wanted:
                        for task in producers:
                            if task.done():
                                await task
                                pytest.fail(f"seed {SEED}: a producer stopped before SIGKILL")
                        await asyncio.sleep(0.002)
                await asyncio.sleep(rng.uniform(0, 0.05))
                returncode = await holder[0].stop(kill=True)
                assert returncode == -9, f"seed {SEED}: daemon exited {returncode} before SIGKILL"
                await asyncio.gather(*producers)
            finally:
                for task in producers:
                    task.cancel()
                await asyncio.gather(*producers, return_exceptions=True)
            holder[0] = await DaemonProcess.start(data_dir, port, log_path, session)
            url = holder[0].records_url
            assert len(in_flight) == PRODUCERS, f"seed {SEED}: {len(in_flight)} in flight"

            keys = [record["game_id"] for batch in round_acked for record in batch]
            assert_stored_once(await fetch_games(session, url, keys), round_acked)
            # acknowledged batches, of this round and earlier ones, come back only as duplicates
            earlier = rng.sample(acked, min(2, len(acked)))
            for batch in rng.sample(round_acked, min(2, len(round_acked))) + earlier:
                await resend(session, url, batch, acknowledged=True)
            # a batch cut off by the crash was committed whole or not at all; send it again
            acked_per_round.append(len(round_acked))
            for batch in in_flight:
                if await resend(session, url, batch, acknowledged=False):
                    committed_unacked += 1
                round_acked.append(batch)
            acked.extend(round_acked)

        every_key = [record["game_id"] for batch in acked for record in batch]
        assert_stored_once(await fetch_games(session, holder[0].records_url, every_key), acked)
        returncode = await holder[0].stop(kill=False)
        assert returncode == 0, f"seed {SEED}: SIGTERM exit {returncode}:\n" + holder[0].log_tail()

    stored = stored_game_ids(data_dir / "games" / "games.db")
    assert len(stored) == len(set(stored)), f"seed {SEED}: a game_id is stored twice"
    # every batch posted was finally acknowledged, so the database holds exactly those games
    assert set(stored) == set(every_key), f"seed {SEED}: stored games differ from acknowledged"
    assert len(every_key) >= ROUNDS * (PRODUCERS + 1) * BATCH
    print(
        f"{ROUNDS} rounds: {len(every_key)} games in {len(acked)} acknowledged batches, "
        f"{committed_unacked} of {ROUNDS * PRODUCERS} cut-off batches had been committed; "
        f"batches acknowledged before each SIGKILL: {acked_per_round}"
    )
