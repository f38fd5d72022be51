"""GET /v1/audit and `shoal audit` on a real daemon: job starts and kills, lock grants and
releases, and deploys (POST /v1/audit/deploys) with the signed sender, filtered by kind and
time; nothing can change or delete them."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from config import parse_inventory
from node.audit import KIND_TYPES
from node.audit.entries import run_steps
from node.cli.audit import KINDS, parse_since
from node.ssh.cluster import HttpClusterProbe, deploy_record
from node.ssh.deploy import DeployResult
from tests.node.daemons import FAST_ELECTION
from tests.node.jobs.helpers import SECRET, JobClient, job_daemon, write_secret
from tests.node.runs.cluster import until

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


async def audit(client: JobClient, query: str = "") -> list[dict[str, Any]]:
    status, body = await client.call("GET", f"/v1/audit{query}")
    assert status == 200, body
    assert body["node"] == "n1"
    entries: list[dict[str, Any]] = body["entries"]
    return entries


async def granted(client: JobClient, name: str, holder: str) -> bool:
    status, body = await client.call(
        "POST", f"/v1/locks/{name}/acquire", json={"holder": holder, "ttl_s": 30}
    )
    return status == 200 and bool(body["granted"])


async def test_audit_lists_job_start_and_kill_and_lock_grants_with_the_sender(
    tmp_path: Path,
) -> None:
    flags = {**FAST_ELECTION, "voters": ("n1",)}
    async with job_daemon(tmp_path, flags) as client:
        job = await client.start(["sleep", "30"])
        before_kill = time.time()
        await client.kill(job["job_id"], signal="TERM", grace_s=1)
        await client.wait(job["job_id"])
        await until(lambda: granted(client, "train", "trainer-a"), 20, "a lock grant")
        status, _ = await client.call(
            "POST", "/v1/locks/train/release", json={"holder": "trainer-a"}
        )
        assert status == 200

        jobs = await audit(client, "?kind=job")
        assert [(e["action"], e["subject"], e["sender"]) for e in jobs] == [
            ("start", job["job_id"], "cli-tester"),
            ("kill", job["job_id"], "cli-tester"),
        ]
        assert jobs[0]["detail"]["argv"] == ["sleep", "30"]
        assert {e["node"] for e in jobs} == {"n1"}
        assert all(e["outcome"] == "done" for e in jobs)
        locks = await audit(client, "?kind=lock")
        assert [(e["action"], e["subject"], e["sender"]) for e in locks] == [
            ("grant", "train", "cli-tester"),
            ("release", "train", "cli-tester"),
        ]
        assert locks[0]["detail"]["holder"] == "trainer-a"
        since = await audit(client, f"?kind=job&since={before_kill}")
        assert [e["action"] for e in since] == ["kill"]
        assert await audit(client, f"?since={time.time() + 3600}") == []
        for kind in ("deploy", "drain", "keyring", "certificate"):
            assert await audit(client, f"?kind={kind}") == []
        everything = await audit(client)
        assert {e["kind"] for e in everything} == {"job", "lock"}
        paged = await audit(client, "?limit=1")
        assert paged == everything[:1]

        status, body = await client.call("GET", "/v1/audit?kind=payroll")
        assert status == 400
        assert body["param"] == "kind"
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            status, body = await client.call(method, "/v1/audit", json={"entries": []})
            assert status == 405, (method, body)
            status, _ = await client.call(method, f"/v1/audit/{jobs[0]['id']}")
            assert status in (404, 405)
        assert await audit(client, "?kind=job") == jobs


async def test_shoal_audit_prints_json_filtered_by_kind_and_since(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.start(["true"])
        await client.wait(job["job_id"])
        config = tmp_path / "cli.yaml"
        config.write_text(json.dumps({"secret_file": str(write_secret(tmp_path))}))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "node",
            "audit",
            "--node",
            client.base,
            "--config",
            str(config),
            "--since",
            "1h",
            "--kind",
            "job",
            "--json",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    entries = json.loads(out)["entries"]
    assert [(e["action"], e["subject"]) for e in entries] == [("start", job["job_id"])]
    assert entries[0]["sender"].startswith("cli-")


def test_since_takes_ages_unix_seconds_and_iso_times() -> None:
    now = 1_000_000.0
    assert parse_since("1h", now) == now - 3600
    assert parse_since("30m", now) == now - 1800
    assert parse_since("90s", now) == now - 90
    assert parse_since("2d", now) == now - 2 * 86400
    assert parse_since("12345.5", now) == 12345.5
    assert parse_since("1970-01-02T00:00:00", now) == 86400.0


def test_the_cli_offers_every_kind_the_route_knows() -> None:
    assert set(KINDS) == set(KIND_TYPES)


def test_run_steps_names_each_run_whose_step_or_state_moved() -> None:
    before = {"r1": {"step": "queued", "state": "queued"}, "r2": {"step": "running"}}
    after = {
        "r1": {"step": "locked", "state": "running", "note": "lock granted"},
        "r2": {"step": "running"},
        "r3": {"step": "queued", "state": "queued"},
    }
    assert run_steps(before, after) == [
        {"run_id": "r1", "step": "locked", "state": "running", "note": "lock granted"},
        {"run_id": "r3", "step": "queued", "state": "queued", "note": None},
    ]


async def test_deploys_are_recorded_through_the_probe_and_listed_as_kind_deploy(
    tmp_path: Path,
) -> None:
    async with job_daemon(tmp_path) as client:
        port = urlsplit(client.base).port
        inventory = parse_inventory({"hosts": {"n1": {"ssh_host": "127.0.0.1", "p2p_port": port}}})
        certificate = {"serial": "1a2b", "not_after": "2027-01-01T00:00:00+00:00", "issued": True}
        upgraded = DeployResult(
            "n1",
            "upgraded",
            12.5,
            version="0.2.0+gabc",
            fingerprint="f" * 64,
            certificate=certificate,
        )
        unchanged = DeployResult("n1", "unchanged", 0.3)
        assert deploy_record(unchanged, rolling=False) is None
        async with HttpClusterProbe(inventory, SECRET, sender="cli-deployer") as probe:
            assert await probe.record("n1", upgraded, rolling=True) is None
            assert await probe.record("n1", unchanged, rolling=False) is None
            member = await probe.member("n1")
        assert member is not None
        assert member.node_id == "n1"
        assert "n1" in member.alive

        deploys = await audit(client, "?kind=deploy")
        assert [(e["action"], e["subject"], e["sender"]) for e in deploys] == [
            ("deploy", "n1", "cli-deployer"),
            ("certificate issue", "n1", "cli-deployer"),
        ]
        detail = deploys[0]["detail"]
        assert (detail["status"], detail["version"], detail["rolling"]) == (
            "upgraded",
            "0.2.0+gabc",
            True,
        )
        assert "@" in detail["operator"]
        assert deploys[1]["detail"] == {"serial": "1a2b", "not_after": "2027-01-01T00:00:00+00:00"}
        status, body = await client.call(
            "POST", "/v1/audit/deploys", json={"host": "n1", "status": "removed"}
        )
        assert status == 400, body
        assert len(await audit(client, "?kind=deploy")) == 2
