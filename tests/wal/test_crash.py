"""Crash safety: a writer process SIGKILLed at random moments never loses an acknowledged entry.
SHOAL_WAL_CRASH_ROUNDS sets the kill rounds (default 50; raise it for a soak), SHOAL_WAL_CRASH_SEED
replays one sequence."""

from __future__ import annotations

import asyncio
import json
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from wal import WalConfig, WriteAheadLog

SCRIPT = Path(__file__).with_name("crash_writer.py")
REPO = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("SHOAL_WAL_CRASH_ROUNDS", "50"))
READ_DEADLINE_S = 30.0


@dataclass
class Acks:
    """What writer processes acknowledged: id -> token of appends, ids of commits."""

    appended: dict[int, str] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)

    def take(self, line: str) -> None:
        kind, *rest = line.split()
        if kind == "a":
            entry_id, token = int(rest[0]), rest[1]
            assert self.appended.setdefault(entry_id, token) == token, f"id {entry_id} reused"
        elif kind == "c":
            self.committed.add(int(rest[0]))
        else:
            raise AssertionError(f"unexpected line from writer: {line!r}")


def start_writer(path: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(path), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )


def read_acks(proc: subprocess.Popen[bytes], acks: Acks, wanted: int) -> int:
    """Read complete lines until `wanted` appends were acknowledged or the stream ends."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = b""
    seen = 0
    deadline = time.monotonic() + READ_DEADLINE_S
    while seen < wanted or wanted < 0:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"writer gave no output for {READ_DEADLINE_S} s"
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            acks.take(line.decode())
            seen += line.startswith(b"a ")
    return seen


def kill_and_drain(proc: subprocess.Popen[bytes], acks: Acks) -> None:
    """SIGKILL the writer; lines it printed before dying were acknowledged too."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    read_acks(proc, acks, wanted=-1)
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode()
    assert proc.stdout is not None
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, f"writer died on its own: {stderr}"


def verify(path: Path, acks: Acks) -> int:
    """Every acknowledged append is present exactly once, every acknowledged commit holds."""
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if "entries" not in tables:
            # Killed while creating the file: nothing can have been acknowledged yet.
            assert not acks.appended
            return 0
        rows = conn.execute("SELECT id, payload, state FROM entries").fetchall()
    tokens = {row[0]: json.loads(row[1])["token"] for row in rows}
    states = {row[0]: row[2] for row in rows}
    assert len(set(tokens.values())) == len(tokens), "a token was stored twice"
    for entry_id, token in acks.appended.items():
        assert tokens.get(entry_id) == token, f"acknowledged entry {entry_id} ({token}) lost"
    for entry_id in acks.committed:
        assert states[entry_id] == "committed", f"acknowledged commit of {entry_id} lost"
    return len(rows)


def test_sigkill_at_random_moments_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    seed = int(os.environ.get("SHOAL_WAL_CRASH_SEED", str(random.randrange(1 << 30))))
    print(f"SHOAL_WAL_CRASH_SEED={seed}")  # shown on failure, to replay the same kills
    rng = random.Random(seed)
    path = tmp_path / "crash.db"
    acks = Acks()
    for round_ in range(ROUNDS):
        tasks = rng.choice((1, 8, 32, 128))
        proc = start_writer(path, "--tasks", str(tasks))
        try:
            if rng.random() < 0.1:
                time.sleep(rng.random() * 0.15)  # may land while opening or recovering
            else:
                read_acks(proc, acks, wanted=rng.randint(1, min(400, 30 * tasks)))
                time.sleep(rng.random() * 0.005)
        finally:
            kill_and_drain(proc, acks)
        rows = verify(path, acks)
        assert rows >= len(acks.appended), f"round {round_} (seed {seed})"
    assert len(acks.appended) > ROUNDS


async def test_reopened_after_kills_the_log_is_consistent(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    acks = Acks()
    for wanted in (50, 200, 5):
        proc = start_writer(path, "--tasks", "64")
        try:
            read_acks(proc, acks, wanted=wanted)
        finally:
            kill_and_drain(proc, acks)
    rows = verify(path, acks)
    async with WriteAheadLog(path, config=WalConfig(max_pending=10_000_000)) as wal:
        stats = await wal.stats()
        assert stats.appended_total == rows == stats.last_id
        assert stats.pending + stats.committed == rows
        assert stats.committed >= len(acks.committed)
        assert await wal.append("after_crash", {}) == rows + 1


def test_two_processes_append_to_one_file_without_collisions(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"

    async def prepare() -> None:
        async with WriteAheadLog(path):
            pass

    asyncio.run(prepare())
    acks = Acks()
    writers = [start_writer(path, "--tasks", "16", "--count", "300") for _ in range(2)]
    for proc in writers:
        assert read_acks(proc, acks, wanted=-1) == 300
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    assert sorted(acks.appended) == list(range(1, 601))
    assert verify(path, acks) == 600
