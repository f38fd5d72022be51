"""Durable appends/s and append latency of the WAL at 1, 16, 64 and 1,024 concurrent writers,
against two aiosqlite baselines (one COMMIT per append; 64 tasks sharing one connection) and
the ceiling of 64 writers: plain sqlite3 committing batches of 64 rows in one thread.
Prints JSON. Usage: .venv/bin/python bench/wal_bench.py [--seconds 2.5] [--writers 1 16 64 1024]"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite

from wal import WalConfig, WriteAheadLog

# Entry types of the caller's own (shoal writes only sync_started and sync_completed).
GAME_RECORDED = "game_recorded"

WARMUP_S = 0.3
BASELINE_SCHEMA = (
    """CREATE TABLE entries (
        id INTEGER PRIMARY KEY, entry_type TEXT NOT NULL, key TEXT, payload TEXT NOT NULL,
        state TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
        retries INTEGER NOT NULL DEFAULT 0, error TEXT)""",
    "CREATE UNIQUE INDEX entries_key ON entries (key) WHERE key IS NOT NULL",
    "CREATE INDEX entries_pending ON entries (id) WHERE state = 'pending'",
)
BASELINE_INSERT = (
    "INSERT INTO entries (entry_type, key, payload, state, created_at, updated_at)"
    " VALUES (?, NULL, ?, 'pending', ?, ?)"
)


def payload(n: int) -> dict[str, Any]:
    return {"game_id": f"g-{n:08d}", "host": "node-a", "moves": 61, "winner": n % 2}


async def run_writers(
    writers: int, seconds: float, append_one: Callable[[int], Awaitable[object]]
) -> dict[str, Any]:
    """`writers` tasks call append_one in a loop; returns throughput and latency percentiles."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    measuring = False
    deadline = loop.time() + WARMUP_S + seconds
    counter = 0

    async def writer() -> None:
        nonlocal counter
        while loop.time() < deadline:
            counter += 1
            started = time.perf_counter()
            await append_one(counter)
            if measuring:
                latencies.append(time.perf_counter() - started)

    tasks = [asyncio.create_task(writer()) for _ in range(writers)]
    await asyncio.sleep(WARMUP_S)
    measuring = True
    started = time.perf_counter()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "writers": writers,
        "appends": len(latencies),
        "appends_per_s": round(len(latencies) / elapsed),
        "p50_ms": round(1000 * statistics.median(latencies), 3),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
        "max_ms": round(1000 * latencies[-1], 3),
    }


async def bench_wal(directory: Path, writers: int, seconds: float) -> dict[str, Any]:
    config = WalConfig(max_pending=1_000_000_000)
    async with WriteAheadLog(directory / f"wal-{writers}.db", config=config) as wal:

        async def append_one(n: int) -> object:
            return await wal.append(GAME_RECORDED, payload(n))

        result = await run_writers(writers, seconds, append_one)
        stats = await wal.stats()
    assert stats.appended_total >= result["appends"]
    return result


async def open_baseline(path: Path) -> aiosqlite.Connection:
    db = await aiosqlite.connect(path, timeout=5.0)
    await db.execute("PRAGMA journal_mode = WAL")
    await db.execute("PRAGMA synchronous = FULL")
    for statement in BASELINE_SCHEMA:
        await db.execute(statement)
    await db.commit()
    return db


async def bench_baseline(path: Path, writers: int, seconds: float) -> dict[str, Any]:
    """`writers` tasks sharing one aiosqlite connection, each awaiting INSERT + COMMIT."""
    db = await open_baseline(path)
    try:

        async def append_one(n: int) -> object:
            now = time.time()
            await db.execute(BASELINE_INSERT, (GAME_RECORDED, json.dumps(payload(n)), now, now))
            await db.commit()
            return None

        return await run_writers(writers, seconds, append_one)
    finally:
        await db.close()


def bench_sqlite3_batches(path: Path, rows: int, seconds: float) -> dict[str, Any]:
    """The ceiling of a group commit of `rows` writers: plain sqlite3 in one thread, no event
    loop, one synchronous=FULL transaction of `rows` INSERTs after another."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")
        for statement in BASELINE_SCHEMA:
            db.execute(statement)
        count = 0

        def commit_batch() -> None:
            nonlocal count
            stamp = time.time()
            batch = [
                (GAME_RECORDED, json.dumps(payload(count + i)), stamp, stamp) for i in range(rows)
            ]
            db.execute("BEGIN IMMEDIATE")
            db.executemany(BASELINE_INSERT, batch)
            db.execute("COMMIT")
            count += rows

        warm_until = time.perf_counter() + WARMUP_S
        while time.perf_counter() < warm_until:
            commit_batch()
        count = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            commit_batch()
        elapsed = time.perf_counter() - started
        return {"rows_per_commit": rows, "appends": count, "appends_per_s": round(count / elapsed)}
    finally:
        db.close()


async def main(seconds: float, writer_counts: list[int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wal-bench-") as tmp:
        directory = Path(tmp)
        wal_results = [await bench_wal(directory, n, seconds) for n in writer_counts]
        single = await bench_baseline(directory / "baseline-single.db", 1, seconds)
        shared = await bench_baseline(directory / "baseline-shared.db", 64, seconds)
        ceiling = bench_sqlite3_batches(directory / "baseline-sqlite3.db", 64, seconds)
    by_writers = {r["writers"]: r for r in wal_results}
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
        "seconds_per_measurement": seconds,
        "wal": wal_results,
        "baselines": {
            "aiosqlite_commit_per_append_1_writer": single,
            "aiosqlite_shared_64": shared,
            "sqlite3_batches_of_64_one_thread": ceiling,
        },
    }
    if 64 in by_writers:
        wal64 = by_writers[64]
        report["ratios"] = {
            "wal_64_vs_commit_per_append": round(
                wal64["appends_per_s"] / max(1, single["appends_per_s"]), 2
            ),
            "wal_64_vs_shared_connection_64": round(
                wal64["appends_per_s"] / max(1, shared["appends_per_s"]), 2
            ),
            "wal_64_vs_sqlite3_batches_of_64": round(
                wal64["appends_per_s"] / max(1, ceiling["appends_per_s"]), 2
            ),
        }
        report["targets"] = {
            "appends_per_s_64_ge_50000": wal64["appends_per_s"] >= 50_000,
            "ratio_vs_commit_per_append_ge_15": report["ratios"]["wal_64_vs_commit_per_append"]
            >= 15,
            "ratio_vs_shared_ge_2": report["ratios"]["wal_64_vs_shared_connection_64"] >= 2,
            "p99_64_lt_20ms": wal64["p99_ms"] < 20,
        }
    return report


async def fixed_work(appends_per_writer: int, writers: int) -> dict[str, Any]:
    """`writers` tasks append `appends_per_writer` entries each, untimed: run it under
    `valgrind --tool=callgrind --separate-threads=yes` at two counts, and the difference of the
    instructions per thread over the difference of appends is the cost of an append."""
    with tempfile.TemporaryDirectory(prefix="wal-bench-") as tmp:
        config = WalConfig(max_pending=1_000_000_000)
        async with WriteAheadLog(Path(tmp) / "wal.db", config=config) as wal:
            counter = 0

            async def writer() -> None:
                nonlocal counter
                for _ in range(appends_per_writer):
                    counter += 1
                    await wal.append(GAME_RECORDED, payload(counter))

            await asyncio.gather(*(writer() for _ in range(writers)))
    return {"writers": writers, "appends": counter}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.5)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 16, 64, 1024])
    parser.add_argument(
        "--fixed", type=int, metavar="N", help="append N entries per writer, untimed (callgrind)"
    )
    args = parser.parse_args()
    if args.fixed is not None:
        result = asyncio.run(fixed_work(args.fixed, args.writers[0]))
    else:
        result = asyncio.run(main(args.seconds, args.writers))
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
