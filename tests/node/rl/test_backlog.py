"""Backpressure of the rollouts store: at most rollouts_max_pending unconsumed samples per run,
429 with Retry-After beyond it, producers that block instead of dropping, and the count that
follows the trainer's consumption."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from prometheus_client import CollectorRegistry, generate_latest

from config import ConfigError, load_settings
from node.daemon import NodeDaemon
from node.errors import WeightsError
from node.rl.backlog import RolloutBacklog
from node.rl.stream import RolloutStream, post_rollouts
from node.training.rendezvous import daemon_endpoint
from sync import (
    ROLLOUTS_SCHEMA,
    BacklogFullError,
    RecordStore,
    RecordValidationError,
    SinceQuery,
)
from sync.records.validate import validate_records
from tests.node.daemons import test_settings

CAP = 200
BATCH = 10
PRODUCERS = 3
PER_PRODUCER = 200
LIVENESS_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sample(run: str, index: int, created_at: float | None = None) -> dict[str, Any]:
    return {
        "sample_id": f"{run}-{index:06d}",
        "created_at": float(index) if created_at is None else created_at,
        "model_version": 0,
        "run": run,
        "payload": {"i": index},
    }


async def store_count(session: ClientSession, url: str) -> int:
    async with session.get(f"{url}/v1/records/rollouts/status") as answer:
        return int((await answer.json())["count"])


async def wait_until(check: Any, what: str, timeout_s: float = LIVENESS_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_producers_block_at_the_cap_and_go_on_once_the_trainer_consumes(
    tmp_path: Path,
) -> None:
    settings = test_settings(tmp_path, "solo", rollouts_max_pending=CAP)
    async with NodeDaemon(settings) as daemon, ClientSession() as session:
        url = f"http://127.0.0.1:{daemon.port}"
        endpoint = daemon_endpoint(url)
        waits: list[float] = []
        waits_of = [0] * PRODUCERS
        stop = threading.Event()  # set only when the test failed: unblock the producers

        def produce(producer: int) -> None:
            def sleep(seconds: float) -> None:
                waits.append(seconds)
                waits_of[producer] += 1
                time.sleep(seconds)

            for start in range(0, PER_PRODUCER, BATCH):
                batch = [
                    sample("r", producer * PER_PRODUCER + i, time.time())
                    for i in range(start, start + BATCH)
                ]
                try:
                    post_rollouts(endpoint, batch, sleep=sleep, stop=stop)
                except WeightsError:
                    return

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
        for thread in threads:
            thread.start()
        try:
            # the trainer is stopped: the store fills to the cap, then producers block on 429
            async def full() -> bool:
                count = await store_count(session, url)
                assert count <= CAP, f"{count} unconsumed samples, cap {CAP}"
                return count == CAP and len(waits) >= PRODUCERS

            await wait_until(full, "the producers never reached the cap and waited")

            async def refused_again() -> bool:
                # each producer waited its Retry-After, asked again and was refused again
                return await full() and min(waits_of) >= 2

            await wait_until(refused_again, "a producer was not refused again after its wait")
            assert all(thread.is_alive() for thread in threads)  # blocked, not dropping
            assert min(waits) >= 1.0  # Retry-After: 1

            one_more = [sample("r", 10**6)]
            async with session.post(f"{url}/v1/records/rollouts", json=one_more) as answer:
                assert answer.status == 429
                assert answer.headers["Retry-After"] == "1"
                body = await answer.json()
            assert body["error"] == "too_many_pending"
            assert body["status"] == 429
            assert f"at most {CAP}" in body["reason"]
            assert "'r'" in body["reason"]
            async with session.get(f"{url}/v1/rollouts/pending?run=r") as answer:
                pending = await answer.json()
            assert pending["pending"] == CAP
            assert pending["max_pending"] == CAP
            assert pending["consumed"] is None
            # another run is not held back by this one's backlog
            async with session.post(f"{url}/v1/records/rollouts", json=[sample("q", 1)]) as a:
                assert a.status == 200

            # the trainer resumes: what it consumes makes room, and every sample arrives
            stream = RolloutStream("r", max_lag=10**6, batch_size=50, nodes=[url])
            loop = asyncio.get_running_loop()

            def consume() -> list[dict[str, Any]]:
                consumed: list[dict[str, Any]] = []
                deadline = time.monotonic() + LIVENESS_S
                while len(consumed) < PRODUCERS * PER_PRODUCER:
                    assert time.monotonic() < deadline, f"only {len(consumed)} consumed"
                    consumed += stream.next_batch(0, timeout_s=0.5)
                    read = stream.consumed + stream.dropped_stale + len(stream._buffer)
                    count = asyncio.run_coroutine_threadsafe(
                        store_count(session, url), loop
                    ).result()
                    # the daemon's consumed position is at most what the stream has read
                    assert count - 1 <= CAP + read, (count, read)  # - 1: run q's sample
                return consumed

            consumed = await asyncio.to_thread(consume)
        except BaseException:
            stop.set()
            raise
        finally:
            for thread in threads:
                await asyncio.to_thread(thread.join, LIVENESS_S)
        keys = [record["sample_id"] for record in consumed]
        assert len(keys) == len(set(keys)) == PRODUCERS * PER_PRODUCER  # none dropped
        assert stream.dropped_stale == 0
        async with session.get(f"{url}/v1/rollouts/pending?run=r") as answer:
            assert (await answer.json())["pending"] == 0
        async with session.get(f"{url}/metrics") as answer:
            metrics = await answer.text()
        assert 'shoal_rollouts_refused_total{run="r"}' in metrics


async def test_a_producer_told_to_stop_while_the_store_is_full_says_so(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, "solo", rollouts_max_pending=1)
    async with NodeDaemon(settings) as daemon:
        endpoint = daemon_endpoint(f"http://127.0.0.1:{daemon.port}")
        await asyncio.to_thread(post_rollouts, endpoint, [sample("r", 1)])
        stop = threading.Event()
        stop.set()
        with pytest.raises(WeightsError, match="1 samples not posted"):
            await asyncio.to_thread(post_rollouts, endpoint, [sample("r", 2)], stop=stop)


class Wall:
    """The backlog's clock of admission stamps: 1.0, 2.0, ... one per request."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def ingest(
    backlog: RolloutBacklog, store: RecordStore, records: list[dict[str, Any]]
) -> list[tuple[Any, ...]]:
    """One POST through the gate, as sync.records.routes does it; the rows written."""
    ticket, rows = await backlog.reserve(store, validate_records(ROLLOUTS_SCHEMA, records, "n"))
    backlog.settle(store, ticket, await store.ingest_rows(rows))
    return list(rows)


async def test_the_count_follows_admissions_duplicates_and_consumption(tmp_path: Path) -> None:
    async with RecordStore(tmp_path / "rollouts.db", ROLLOUTS_SCHEMA) as store:
        registry = CollectorRegistry()
        wall = Wall()
        backlog = RolloutBacklog(10, lambda: store, registry=registry, recount_s=3600, wall=wall)
        await ingest(backlog, store, [sample("r", i) for i in range(3)])  # stamped 1.0
        await ingest(backlog, store, [sample("r", i) for i in range(3, 6)])  # 2.0
        await ingest(backlog, store, [sample("r", i) for i in range(4, 8)])  # 2 duplicates
        assert backlog.state("r").pending == 8
        await ingest(backlog, store, [{**sample("x", 1), "run": None}])  # no run: not capped
        with pytest.raises(BacklogFullError, match="holds 8 unconsumed records of 'r'"):
            await ingest(backlog, store, [sample("r", i) for i in range(8, 11)])
        assert backlog.state("r").pending == 8  # nothing of a refused request counts
        with pytest.raises(RecordValidationError, match="send fewer at a time"):
            await ingest(backlog, store, [sample("r", i) for i in range(100, 111)])

        await backlog.consumed("r", (1.0, "r-000002"))  # 0, 1, 2 consumed
        assert backlog.state("r").pending == 5
        await backlog.consumed("r", (1.0, "r-000001"))  # older: nothing changes
        assert backlog.state("r").pending == 5
        await ingest(backlog, store, [sample("r", i) for i in range(20, 25)])
        assert backlog.state("r").pending == 10
        text = generate_latest(registry).decode()
        assert 'shoal_rollouts_pending{run="r"} 10.0' in text
        assert 'shoal_rollouts_refused_total{run="r"} 3.0' in text

        # a restarted daemon counts what its store already holds before admitting more
        restarted = RolloutBacklog(10, lambda: store, recount_s=3600, wall=Wall())
        with pytest.raises(BacklogFullError):
            await ingest(restarted, store, [sample("r", 30)])
        await restarted.consumed("r", (1.0, "r-000002"))
        assert restarted.state("r").pending == 10  # counted from the store: 3..7, 20..24
        await restarted.consumed("r", (3.0, "r-000007"))
        assert restarted.state("r").pending == 5
        written = await ingest(restarted, store, [sample("r", 30)])
        assert restarted.state("r").pending == 6
        # stamps never go back, even when the clock does (it restarted at 1.0)
        assert written[0][ROLLOUTS_SCHEMA.columns.index("created_at")] > wall.now


async def test_admission_stamps_follow_the_order_of_requests(tmp_path: Path) -> None:
    async with RecordStore(tmp_path / "rollouts.db", ROLLOUTS_SCHEMA) as store:
        backlog = RolloutBacklog(1000, lambda: store, wall=lambda: 5.0)
        late = [sample("r", 1, created_at=0.0)]  # generated long ago, posted now
        first = await ingest(backlog, store, [sample("r", 2, created_at=9.0)])
        second = await ingest(backlog, store, late)
        at = ROLLOUTS_SCHEMA.columns.index("created_at")
        assert first[0][at] < second[0][at]
        page = await store.since(SinceQuery(ts=first[0][at], after="r-000002"))
        assert [record["sample_id"] for record in page.records] == ["r-000001"]


async def test_a_stale_count_is_checked_against_the_store_before_refusing(tmp_path: Path) -> None:
    async with RecordStore(tmp_path / "rollouts.db", ROLLOUTS_SCHEMA) as store:
        now = [0.0]
        backlog = RolloutBacklog(3, lambda: store, recount_s=1.0, clock=lambda: now[0])
        batch = validate_records(ROLLOUTS_SCHEMA, [sample("r", i) for i in range(3)], "n1")
        ticket, _ = await backlog.reserve(store, batch)
        backlog.settle(store, ticket, None)  # the ingest failed: nothing pending
        assert backlog.state("r").pending == 0
        assert backlog.state("r").inflight == 0
        await ingest(backlog, store, [sample("r", i) for i in range(3)])
        backlog.state("r").pending += 5  # an over-count (e.g. rows of unknown owner)
        first = (await store.since(SinceQuery(limit=1))).records[0]
        one = validate_records(ROLLOUTS_SCHEMA, [sample("r", 3)], "n1")
        with pytest.raises(BacklogFullError):
            await backlog.reserve(store, one)  # counted 0.0 s ago: not recounted
        await backlog.consumed("r", (first["created_at"], "r-000000"))
        now[0] = 2.0
        await ingest(backlog, store, [sample("r", 3)])
        assert backlog.state("r").pending == 3  # recounted: 1, 2, 3


def test_the_cap_is_a_validated_setting() -> None:
    assert load_settings(env={}, flags={}).settings.rollouts_max_pending == 100_000
    with pytest.raises(ConfigError, match="rollouts_max_pending"):
        load_settings(env={}, flags={"rollouts_max_pending": 0})


async def test_the_openapi_document_names_the_429_of_the_rollouts_post(tmp_path: Path) -> None:
    async with NodeDaemon(test_settings(tmp_path, "solo")) as daemon, ClientSession() as session:
        url = f"http://127.0.0.1:{daemon.port}/v1/openapi.json"
        paths = (await (await session.get(url)).json())["paths"]
    assert "429" in paths["/v1/records/rollouts"]["post"]["responses"]
    assert "429" not in paths["/v1/records/games"]["post"]["responses"]
    assert "post" in paths["/v1/rollouts/consumed"]
    assert "get" in paths["/v1/rollouts/pending"]


HAMMER_THREADS = 4
HAMMER_REQUESTS = 300
HAMMER_RECORDS = 100
RSS_BOUND_BYTES = 64 * 1024 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def post_raw(url: str, body: bytes) -> tuple[int, str | None]:
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status), answer.headers.get("Retry-After")
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code), exc.headers.get("Retry-After")


@pytest.mark.timeout(300)
def test_the_daemons_memory_stays_flat_while_producers_hammer_a_full_store(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = tmp_path / "node.yaml"
    config.write_text("rollouts_max_pending: 100\n")
    log = tmp_path / "daemon.log"
    args = ["serve", "--node-id", "rss", "--data-dir", str(tmp_path / "data"), "--no-mdns"]
    args += ["--config", str(config), "--port", str(port), "--bind", "127.0.0.1"]
    with log.open("w") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "node", *args], stdout=out, stderr=out)
    try:
        url = f"http://127.0.0.1:{port}/v1/records/rollouts"
        deadline = time.monotonic() + LIVENESS_S
        while True:
            assert daemon.poll() is None, log.read_text()
            with contextlib.suppress(OSError):
                if (
                    post_raw(url, json.dumps([sample("r", i) for i in range(100)]).encode())[0]
                    == 200
                ):
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        filler = "x" * 1500

        def hammer(thread: int, requests: int) -> list[tuple[int, str | None]]:
            answers = []
            for request in range(requests):
                first = (thread * HAMMER_REQUESTS + request) * HAMMER_RECORDS + 1000
                records = [
                    {**sample("r", first + i), "payload": {"filler": filler, "i": i}}
                    for i in range(HAMMER_RECORDS)
                ]
                answers.append(post_raw(url, json.dumps(records).encode()))
            return answers

        warm = hammer(HAMMER_THREADS, 50)  # the first requests grow caches and arenas
        before = rss_bytes(daemon.pid)
        with ThreadPoolExecutor(HAMMER_THREADS) as pool:
            answers = [
                answer
                for answers in pool.map(hammer, range(HAMMER_THREADS), [HAMMER_REQUESTS] * 4)
                for answer in answers
            ]
        after = rss_bytes(daemon.pid)
        assert set(warm + answers) == {(429, "1")}  # every request refused, none trimmed
        grown = after - before
        assert grown <= RSS_BOUND_BYTES, f"RSS grew {grown / 2**20:.0f} MiB under 429s"
        status = urllib.request.urlopen(f"{url}/status", timeout=10)
        assert json.loads(status.read())["count"] == 100
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
