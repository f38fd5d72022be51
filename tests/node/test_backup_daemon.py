"""`shoal backup` of a real daemon while records are posted continuously, then `shoal restore`
into a fresh data dir and a daemon started on it: every record acknowledged before the backup
began is there, with the WAL's pending entries, the jobs' records and the node id."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tarfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from config import signing_middleware
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings
from tests.node.jobs.client_daemon import ROOT, SECRET, ServedNode, child_env, served_node
from tests.sync.record_fixtures import game
from wal import WriteAheadLog

pytestmark = pytest.mark.timeout(300)

BATCH = 20
MAX_BATCHES = 2000
"""The ingest loop's bound: it stops after this many batches even if nobody stops it."""
GET_CHUNK = 200


@dataclass
class Ingest:
    """Batches of games posted one after another; which keys were acknowledged, and when."""

    session: aiohttp.ClientSession
    url: str
    acked: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    progressed: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        for batch in range(MAX_BATCHES):
            if self.stop.is_set():
                return
            records = [game(batch * BATCH + i) for i in range(BATCH)]
            async with self.session.post(f"{self.url}/v1/records/games", json=records) as answer:
                if answer.status != 200:
                    self.failures.append(f"{answer.status}: {await answer.text()}")
                    continue
            self.acked.extend(record["game_id"] for record in records)
            self.progressed.set()


def signed() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(middlewares=(signing_middleware(SECRET, "cli-tester"),))


async def shoal(*args: str) -> tuple[int, str, str]:
    """`python -m node ARGS` in a child process, without blocking the ingest loop."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "node",
        *args,
        cwd=ROOT,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 240)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedNode]:
    with served_node(tmp_path_factory.mktemp("backup")) as served:
        yield served


async def run_job(session: aiohttp.ClientSession, url: str) -> str:
    async with session.post(f"{url}/v1/jobs", json={"argv": ["echo", "kept"]}) as answer:
        assert answer.status == 201, await answer.text()
        job_id = str((await answer.json())["job_id"])
    async with session.get(f"{url}/v1/jobs/{job_id}/wait?timeout_s=30") as answer:
        assert (await answer.json())["state"] == "succeeded"
    return job_id


async def stored_keys(session: aiohttp.ClientSession, url: str, keys: list[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(keys), GET_CHUNK):
        chunk = keys[start : start + GET_CHUNK]
        params = [("key", key) for key in chunk]
        async with session.get(f"{url}/v1/records/games/get", params=params) as answer:
            assert answer.status == 200, await answer.text()
            found.update(record["game_id"] for record in (await answer.json())["records"])
    return found


@contextlib.asynccontextmanager
async def restored_daemon(tmp_path: Path, data_dir: Path) -> AsyncIterator[str]:
    secret = tmp_path / "restored-secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    settings = test_settings(tmp_path, "unused", data_dir=data_dir, node_id=None)
    settings = settings.model_copy(update={"secret_file": secret})
    async with NodeDaemon(settings) as daemon:
        yield f"http://127.0.0.1:{daemon.port}"


async def test_backup_under_ingest_restores_every_acknowledged_record(
    node: ServedNode, tmp_path: Path
) -> None:
    archive = tmp_path / "n1.tar"
    wal_path = node.data_dir / "wal" / "wal.db"
    async with WriteAheadLog(wal_path) as wal:
        pending_id = await wal.append("test.pending", {"kept": True})
    async with signed() as session:
        job_id = await run_job(session, node.url)
        ingest = Ingest(session, node.url)
        loop = asyncio.create_task(ingest.run())
        await ingest.progressed.wait()
        acked_before = list(ingest.acked)
        code, out, err = await shoal(
            "backup", "--out", str(archive), "--config", str(node.config_file), "--json"
        )
        ingest.stop.set()
        await loop
    assert code == 0, err
    assert not ingest.failures, ingest.failures[:3]
    summary = json.loads(out)
    assert summary["file"] == str(archive)
    assert summary["bytes"] == archive.stat().st_size
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[-1] == "MANIFEST.json"
    assert {"node_id", "wal/wal.db", "games/games.db", "backup/files.json"} <= set(names)
    assert f"jobs/{job_id}/stdout.log" in names

    restored = tmp_path / "restored"
    code, out, err = await shoal("restore", str(archive), "--data-dir", str(restored), "--json")
    assert code == 0, err
    assert json.loads(out)["node_id"] == "n1"
    async with WriteAheadLog(restored / "wal" / "wal.db") as wal:
        assert [entry.id for entry in await wal.pending("test.pending")] == [pending_id]
    async with restored_daemon(tmp_path, restored) as url, signed() as session:
        async with session.get(f"{url}/v1/status") as answer:
            assert (await answer.json())["node_id"] == "n1"
        found = await stored_keys(session, url, acked_before)
        assert found == set(acked_before), f"{len(acked_before) - len(found)} records lost"
        async with session.get(f"{url}/v1/jobs/{job_id}") as answer:
            record: dict[str, Any] = await answer.json()
        assert record["state"] == "succeeded"
        assert record["exit_code"] == 0


async def test_with_files_carries_synced_files_and_the_list_has_their_hashes(
    node: ServedNode, tmp_path: Path
) -> None:
    weights = node.data_dir / "models" / "policy-7.bin"
    weights.write_bytes(b"weights" * 1000)
    plain, full = tmp_path / "plain.tar", tmp_path / "full.tar"
    for archive, extra in ((plain, ()), (full, ("--with-files",))):
        code, _, err = await shoal(
            "backup",
            "--out",
            str(archive),
            "--node",
            node.url,
            "--config",
            str(node.config_file),
            *extra,
        )
        assert code == 0, err
    with tarfile.open(plain) as tar:
        assert "models/policy-7.bin" not in tar.getnames()
        listed = json.loads(tar.extractfile("backup/files.json").read())  # type: ignore[union-attr]
    (entry,) = [e for e in listed if e["path"] == "policy-7.bin"]
    assert entry["category"] == "models"
    assert entry["size"] == 7000
    assert entry["hash"]
    restored = tmp_path / "restored"
    code, _, err = await shoal("restore", str(full), "--data-dir", str(restored))
    assert code == 0, err
    assert (restored / "models" / "policy-7.bin").read_bytes() == weights.read_bytes()
