"""Record ingestion throughput: 8 producers posting 1,000-game batches to a loopback server.

Prints one JSON document: acknowledged records/s through HTTP (server in a subprocess), plain
sqlite3 executemany of the same rows with the same pragmas, their ratio, and a pull of 100,000
records from that server into a local store (pages of 5,000; with the puller's CPU seconds and
the load average, as the machine may be shared). With both shapes, a summary puts
the array-shaped figures beside the string-shaped ones of the same run and the targets
(>= 50,000 records/s, >= 0.5x plain sqlite3, a pull of 100,000 in <= 3 s).
Usage: python bench/records_bench.py [--records N] [--producers 8] [--moves array|string|both]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.server import serve_until_sigterm, server_process  # noqa: E402
from config import Timeouts  # noqa: E402
from net import PeerClient  # noqa: E402
from sync import (  # noqa: E402
    GAMES_SCHEMA,
    RecordStore,
    RecordStores,
    StoreOptions,
    pull_records,
    record_routes,
    validate_records,
)
from sync.records.schema import create_table_sql, insert_sql  # noqa: E402

BATCH = 1000
TARGET_RECORDS_PER_S = 50_000
TARGET_RATIO = 0.5
TARGET_PULL_S = 3.0
PULL_RECORDS = 100_000
TIME_LIMIT_S = 60.0


def make_record(index: int, moves_shape: str) -> dict[str, Any]:
    """A ~1 KB game: 120 moves as an array of move strings, or 160 moves as one string."""
    files = "abcdefgh"
    count = 120 if moves_shape == "array" else 160
    moves = [
        f"{files[i % 8]}{i % 8 + 1}{files[(i + 3) % 8]}{(i + 5) % 8 + 1}" for i in range(count)
    ]
    return {
        "game_id": f"bench-{moves_shape}-{index:09d}",
        "created_at": 1_700_000_000.0 + index * 0.001,
        "board_type": "square8",
        "num_players": 2,
        "winner": index % 2,
        "moves": moves if moves_shape == "array" else " ".join(moves),
        "quality": (index % 100) / 100,
        "source_node": "bench-producer",
    }


async def serve(data_dir: Path) -> None:
    stores = RecordStores(data_dir, options=StoreOptions())
    app = web.Application()
    app.add_routes(record_routes(stores, "bench-server"))
    async with stores:
        await serve_until_sigterm(app)


async def produce(url: str, bodies: list[bytes], producers: int) -> tuple[int, float]:
    queue = list(reversed(bodies))
    acknowledged = 0
    deadline = time.monotonic() + TIME_LIMIT_S

    async def producer(session: aiohttp.ClientSession) -> None:
        nonlocal acknowledged
        while queue and time.monotonic() < deadline:
            body = queue.pop()
            async with session.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                data = await response.json()
                assert response.status == 200, data
                acknowledged += data["accepted"] + data["duplicates"]

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(producer(session) for _ in range(producers)))
        return acknowledged, time.perf_counter() - start


def plain_sqlite(path: Path, records: list[dict[str, Any]]) -> float:
    rows = validate_records(GAMES_SCHEMA, records, "bench")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    for statement in create_table_sql(GAMES_SCHEMA):
        conn.execute(statement)
    sql = insert_sql(GAMES_SCHEMA)
    start = time.perf_counter()
    for offset in range(0, len(rows), BATCH):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows[offset : offset + BATCH])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return len(rows) / elapsed


async def pull(base_url: str, path: Path, limit: int) -> dict[str, Any]:
    async with (
        PeerClient(timeouts=Timeouts(http_request_s=120)) as peers,
        RecordStore(path, GAMES_SCHEMA) as store,
    ):
        start, cpu = time.perf_counter(), _cpu_s()
        result = await pull_records(
            peers, base_url, "games", store, limit=limit, max_records=PULL_RECORDS
        )
        elapsed, cpu = time.perf_counter() - start, _cpu_s() - cpu
    return {
        "pulled": result.pulled,
        "inserted": result.inserted,
        "seconds": round(elapsed, 2),
        "records_per_s": round(result.pulled / elapsed),
        "puller_cpu_s": round(cpu, 2),
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }


def _cpu_s() -> float:
    """CPU seconds of this process (every thread: the store's writer too), user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_shape(shape: str, count: int, producers: int, work: Path) -> dict[str, Any]:
    records = [make_record(i, shape) for i in range(count)]
    bodies = [
        json.dumps(records[i : i + BATCH], separators=(",", ":")).encode()
        for i in range(0, count, BATCH)
    ]
    server_dir = work / f"server-{shape}"
    with server_process([__file__, "--serve", str(server_dir)]) as port:
        base_url = f"http://127.0.0.1:{port}"
        acknowledged, elapsed = asyncio.run(
            produce(f"{base_url}/v1/records/games", bodies, producers)
        )
        pulled = asyncio.run(pull(base_url, work / f"pulled-{shape}.db", 5000))
    http_rate = acknowledged / elapsed
    plain_rate = plain_sqlite(work / f"plain-{shape}.db", records[:acknowledged])
    return {
        "moves": shape,
        "meets_targets": {
            "records_per_s": http_rate >= TARGET_RECORDS_PER_S,
            "ratio": http_rate / plain_rate >= TARGET_RATIO,
            "pull_seconds": pulled["seconds"] <= TARGET_PULL_S,
        },
        "record_bytes": round(sum(len(b) for b in bodies) / count),
        "records": acknowledged,
        "http_seconds": round(elapsed, 2),
        "http_records_per_s": round(http_rate),
        "plain_sqlite_records_per_s": round(plain_rate),
        "ratio": round(http_rate / plain_rate, 3),
        "pull": pulled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--moves", choices=["array", "string", "both"], default="both")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    shapes = ["string", "array"] if args.moves == "both" else [args.moves]
    with tempfile.TemporaryDirectory(prefix="records-bench-") as work:
        results = [run_shape(s, args.records, args.producers, Path(work)) for s in shapes]
    report = {
        "bench": "records_ingest",
        "producers": args.producers,
        "batch": BATCH,
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "targets": {
            "records_per_s": TARGET_RECORDS_PER_S,
            "ratio": TARGET_RATIO,
            "pull_seconds": TARGET_PULL_S,
        },
        "results": results,
    }
    by_shape = {result["moves"]: result for result in results}
    if set(by_shape) == {"array", "string"}:
        array, string = by_shape["array"], by_shape["string"]
        report["array_vs_string"] = {
            "records_per_s": [array["http_records_per_s"], string["http_records_per_s"]],
            "ratio_to_plain_sqlite": [array["ratio"], string["ratio"]],
            "pull_seconds": [array["pull"]["seconds"], string["pull"]["seconds"]],
        }
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
