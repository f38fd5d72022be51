"""One node's jobs through the HTTP API of a real daemon: exit codes, logs, kill, files."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from health import BreakerConfig, BreakerRegistry
from node.jobs import JobService
from node.jobs.component import JobApi
from node.jobs.gang import GangService
from node.runtime import NodeRuntime
from tests.cluster.waiting import async_wait_until
from tests.node.daemons import test_settings
from tests.node.jobs.helpers import JobClient, job_daemon, process_group_members, process_state


async def test_exit_codes_zero_three_and_a_signal_death(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        ok = await client.start(["sh", "-c", "echo hello; echo oops >&2"], name="ok")
        three = await client.start(["sh", "-c", "exit 3"])
        segv = await client.start(["sh", "-c", "kill -SEGV $$"])
        ok, three, segv = [await client.wait(j["job_id"]) for j in (ok, three, segv)]
        assert (ok["state"], ok["exit_code"], ok["signal"]) == ("succeeded", 0, None)
        assert (three["state"], three["exit_code"]) == ("failed", 3)
        assert (segv["state"], segv["exit_code"], segv["signal"]) == ("failed", None, "SIGSEGV")
        assert await client.log(ok["job_id"]) == b"hello\n"
        assert await client.log(ok["job_id"], "stderr") == b"oops\n"
        assert ok["log_bytes"] == {"stdout": 6, "stderr": 5}
        assert ok["name"] == "ok"
        assert ok["node"] == "n1"
        assert ok["argv"][0] == "sh"


TERM_IGNORER = (
    "import os, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


async def _first_line(client: JobClient, job_id: str) -> str:
    async with asyncio.timeout(30):
        while True:
            text = (await client.log(job_id)).decode()
            if "\n" in text:
                return text.split("\n", 1)[0]
            await asyncio.sleep(0.02)


async def test_kill_ends_a_term_ignoring_job_and_its_children(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.start([sys.executable, "-c", TERM_IGNORER])
        grandchild = int(await _first_line(client, job["job_id"]))
        pid = job["pid"]
        assert job["state"] == "running"
        assert process_state(pid) not in (None, "Z")
        assert process_state(grandchild) not in (None, "Z")
        killed = await client.kill(job["job_id"], signal="TERM", grace_s=0.3)
        assert killed["job_id"] == job["job_id"]
        ended = await client.wait(job["job_id"])
        assert ended["state"] == "killed", ended
        assert ended["signal"] == "SIGKILL"
        assert ended["exit_code"] is None
        assert process_state(pid) is None, "the job's process survived the kill"
        assert process_state(grandchild) is None, "a child of the job survived the kill"
        assert process_group_members(pid) == []


# Traps TERM: the handler marks that its cleanup began, waits for the test to release it, says
# so on stdout, then dies of the TERM it trapped. $1: the mark file, $2: the release file.
TERM_CLEANER = (
    'trap \'touch "$1"; while [ ! -e "$2" ]; do sleep 0.02; done; '
    "echo cleanup-done; trap - TERM; kill -TERM $$' TERM\n"
    "echo ready\n"
    "sleep 600 & wait\n"
)


async def test_kill_gives_a_term_trapping_job_its_grace_to_clean_up(tmp_path: Path) -> None:
    started, release = tmp_path / "cleanup-started", tmp_path / "release"
    async with job_daemon(tmp_path) as client:
        job = await client.start(["sh", "-c", TERM_CLEANER, "sh", str(started), str(release)])
        assert await _first_line(client, job["job_id"]) == "ready"  # the trap is set
        await client.kill(job["job_id"], signal="TERM", grace_s=5)
        await async_wait_until(
            started.exists, timeout_s=30, message="the job's TERM trap to begin its cleanup"
        )
        status, during = await client.call("GET", f"/v1/jobs/{job['job_id']}")
        assert status == 200
        assert during["state"] == "running", f"ended during its grace: {during}"
        release.touch()
        ended = await client.wait(job["job_id"])
        assert ended["state"] == "killed", ended
        assert (ended["signal"], ended["exit_code"]) == ("SIGTERM", None), ended
        assert ended["reason"] == "killed with SIGTERM", ended
        assert (await client.log(job["job_id"])).splitlines() == [b"ready", b"cleanup-done"]
        assert process_group_members(job["pid"]) == []


async def test_timeout_ends_the_job_as_timed_out(tmp_path: Path) -> None:
    async with job_daemon(tmp_path, {"jobs.kill_grace_s": 0.2}) as client:
        job = await client.start(["sleep", "30"], timeout_s=0.3)
        ended = await client.wait(job["job_id"])
        assert ended["state"] == "timed_out", ended
        assert ended["signal"] == "SIGTERM"
        assert "timed out after 0.3 s" in ended["reason"]
        assert process_state(job["pid"]) is None


async def test_job_id_is_idempotent_and_a_different_spec_conflicts(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        spec = {"job_id": "train-1", "name": "t", "argv": ["sh", "-c", "echo $SHOAL_JOB_ID"]}
        first_status, first = await client.call("POST", "/v1/jobs", json=spec)
        again_status, again = await client.call("POST", "/v1/jobs", json=spec)
        assert (first_status, again_status) == (201, 200)
        assert again["job_id"] == first["job_id"] == "train-1"
        assert again["created_at"] == first["created_at"]
        other = {**spec, "argv": ["true"]}
        status, body = await client.call("POST", "/v1/jobs", json=other)
        assert status == 409, body
        assert body["error"] == "job_id_conflict"
        assert set(body) == {"error", "reason", "status"}
        assert body["status"] == 409
        await client.wait("train-1")
        assert await client.log("train-1") == b"train-1\n"
        status, listing = await client.call("GET", "/v1/jobs")
        assert [j["job_id"] for j in listing["jobs"]] == ["train-1"]


async def test_a_job_id_reposted_with_another_env_cwd_or_timeout_conflicts(
    tmp_path: Path,
) -> None:
    spec = {
        "job_id": "train-2",
        "argv": ["sh", "-c", "echo $A$B; pwd"],
        "env": {"A": "1", "B": "2"},
        "cwd": "work",
        "timeout_s": 60,
    }
    changed = {
        "env": {**spec, "env": {"A": "1", "B": "3"}},
        "env without a variable": {**spec, "env": {"A": "1"}},
        "cwd": {**spec, "cwd": "elsewhere"},
        "no cwd": {k: v for k, v in spec.items() if k != "cwd"},
        "timeout_s": {**spec, "timeout_s": 61},
        "no timeout_s": {k: v for k, v in spec.items() if k != "timeout_s"},
    }
    async with job_daemon(tmp_path) as client:
        status, first = await client.call("POST", "/v1/jobs", json=spec)
        assert status == 201, first
        for what, other in changed.items():
            status, body = await client.call("POST", "/v1/jobs", json=other)
            assert (status, body.get("error")) == (409, "job_id_conflict"), (what, body)
            assert set(body) == {"error", "reason", "status"}, (what, body)
            assert body["status"] == 409
            assert "'train-2'" in body["reason"], body
        ended = await client.wait("train-2")
        assert (ended["state"], ended["cwd"], ended["timeout_s"]) == ("succeeded", "work", 60)
        log = await client.log("train-2")
        assert log.startswith(b"12\n"), log
        assert log.rstrip().endswith(b"/work"), log
        reordered = {**spec, "env": {"B": "2", "A": "1"}}  # the same spec: still idempotent
        status, again = await client.call("POST", "/v1/jobs", json=reordered)
        assert status == 200, again
        assert (again["created_at"], again["state"]) == (first["created_at"], "succeeded")
        assert await client.log("train-2") == log  # not run a second time
        _, listing = await client.call("GET", "/v1/jobs")
        assert [j["job_id"] for j in listing["jobs"]] == ["train-2"]


async def test_bad_requests_answer_400_in_the_one_error_shape(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        status, body = await client.call("POST", "/v1/jobs", json={"argv": "rm -rf /"})
        assert status == 400
        assert body["error"] == "invalid_job"
        assert "not a shell string" in body["reason"]
        status, body = await client.call("POST", "/v1/jobs", json={"argv": ["true"], "x": 1})
        assert status == 400
        assert "unknown field" in body["reason"]
        status, body = await client.call("GET", "/v1/jobs/nope")
        assert (status, body["error"]) == (404, "job_not_found")
        status, body = await client.call("GET", "/v1/jobs?state=bogus")
        assert status == 400
        status, body = await client.call("POST", "/v1/jobs/nope/kill", json={})
        assert status == 404
        job = await client.start(["true"])
        status, body = await client.call(
            "POST", f"/v1/jobs/{job['job_id']}/kill", json={"signal": "NOPE"}
        )
        assert status == 400
        assert "not a signal name" in body["reason"]


async def test_unsigned_requests_are_refused(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client, aiohttp.ClientSession() as plain:
        for method, path in (("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/x")):
            async with plain.request(method, f"{client.base}{path}", json={"argv": ["id"]}) as r:
                assert r.status == 401, (method, path)
        _, listing = await client.call("GET", "/v1/jobs")
        assert listing["jobs"] == []


async def test_files_download_with_hash_and_refuse_escapes(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        script = "mkdir -p out && printf 'result-bytes' > out/r.txt && ln -s /etc/passwd leak"
        job = await client.wait((await client.start(["sh", "-c", script]))["job_id"])
        assert job["state"] == "succeeded"
        url = f"{client.base}/v1/jobs/{job['job_id']}/files"
        async with client.session.get(url, params={"path": "out/r.txt"}) as response:
            assert response.status == 200
            assert await response.read() == b"result-bytes"
            expected = hashlib.sha256(b"result-bytes").hexdigest()
            assert response.headers["X-Shoal-Content-Hash"] == expected
        for bad in ("../spec.json", "/etc/passwd", "leak", "out/../../spec.json"):
            async with client.session.get(url, params={"path": bad}) as response:
                body = await response.json()
                assert response.status == 400, (bad, body)
                assert body["error"] == "bad_path"
        async with client.session.get(f"{url}?path=out%2f..%2f..%2fspec.json") as response:
            assert response.status == 400
        async with client.session.get(url, params={"path": "missing"}) as response:
            assert response.status == 404


async def test_delete_removes_an_ended_job_and_refuses_a_running_one(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        running = await client.start(["sleep", "30"])
        status, body = await client.call("DELETE", f"/v1/jobs/{running['job_id']}")
        assert (status, body["error"]) == (409, "job_running")
        done = await client.wait((await client.start(["true"]))["job_id"])
        job_dir = tmp_path / "n1" / "jobs" / done["job_id"]
        assert job_dir.is_dir()
        status, _ = await client.call("DELETE", f"/v1/jobs/{done['job_id']}")
        assert status == 200
        assert not job_dir.exists()
        status, _ = await client.call("GET", f"/v1/jobs/{done['job_id']}")
        assert status == 404


async def test_allowlist_refuses_other_programs(tmp_path: Path) -> None:
    async with job_daemon(tmp_path, {"jobs.allowed_programs": ["true"]}) as client:
        status, body = await client.call("POST", "/v1/jobs", json={"argv": ["sh", "-c", "id"]})
        assert (status, body["error"]) == (403, "program_not_allowed"), body
        decoy = tmp_path / "bin"
        decoy.mkdir()
        (decoy / "true").write_text("#!/bin/sh\nexit 7\n")
        (decoy / "true").chmod(0o755)
        job = await client.start(["true"], env={"PATH": str(decoy)})
        assert (await client.wait(job["job_id"]))["exit_code"] == 0, "the job's PATH chose"


async def test_status_counts_jobs_and_list_filters_by_state(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        running = await client.start(["sleep", "30"])
        await client.wait((await client.start(["false"]))["job_id"])
        _, status = await client.call("GET", "/v1/status")
        assert status["jobs"]["running"] == 1
        assert status["jobs"]["failed"] == 1
        _, listing = await client.call("GET", "/v1/jobs?state=running")
        assert [j["job_id"] for j in listing["jobs"]] == [running["job_id"]]


async def test_wait_returns_the_running_job_after_its_timeout(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.start(["sleep", "30"])
        waited = await client.wait(job["job_id"], timeout_s=0.1)
        assert waited["state"] == "running"
        assert waited["ended_at"] is None


@pytest.fixture
def traversable_dir() -> Iterator[Path]:
    """A temp dir other users may traverse (pytest's own are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="shoal-run-as-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_run_as_user_when_the_daemon_is_root(traversable_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("run_as applies only when the daemon runs as root")
    nobody = pwd.getpwnam("nobody")
    async with job_daemon(traversable_dir, {"jobs.run_as": "nobody"}) as client:
        script = "id -u; pwd; mktemp"
        job = await client.wait((await client.start(["sh", "-c", script]))["job_id"])
        assert job["state"] == "succeeded", job
        out = (await client.log(job["job_id"])).decode().split()
        assert out[0] == str(nobody.pw_uid)
        job_dir = traversable_dir / "n1" / "jobs" / job["job_id"]
        assert out[1] == str(job_dir / "work")
        assert out[2].startswith(str(job_dir / "tmp"))


async def test_an_unknown_program_fails_with_the_reason(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.wait((await client.start(["/no/such/program"]))["job_id"])
        assert job["state"] == "failed"
        assert job["exit_code"] is None
        assert "cannot start '/no/such/program'" in job["reason"]


async def test_openapi_lists_every_job_route(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, "n")
    breakers = BreakerRegistry(BreakerConfig())
    runtime = NodeRuntime(settings, "n", "127.0.0.1", "0", breakers)
    service = JobService("n", settings.jobs, tmp_path / "jobs", daemon_url=lambda: "x")
    api = JobApi(service, GangService(runtime, service, lambda: None, None))
    app = web.Application()
    app.router.add_routes(api.routes())
    served = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    assert served == {(found.route.method, found.route.path) for found in api.routes()}
    assert all(found.route.callers for found in api.routes())
    assert ("POST", "/v1/jobs/gang/pick") in served


ESCAPER = (
    "import subprocess\n"
    "child = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
)


async def test_processes_that_left_the_group_end_with_the_job(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.wait((await client.start([sys.executable, "-c", ESCAPER]))["job_id"])
        assert job["state"] == "succeeded"
        escaped = int((await client.log(job["job_id"])).decode())
        assert process_state(escaped) is None, "a process of the job outlived it"


async def test_the_job_environment_is_stored_readable_by_the_daemon_only(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        job = await client.wait((await client.start(["true"], env={"API_KEY": "s3cret"}))["job_id"])
        job_dir = tmp_path / "n1" / "jobs" / job["job_id"]
        for name in ("spec.json", "launch.json", "result.json", "supervisor.json"):
            assert (job_dir / name).stat().st_mode & 0o077 == 0, name
        assert job_dir.stat().st_mode & 0o777 == 0o711


async def test_a_deleted_job_id_can_be_used_again(tmp_path: Path) -> None:
    async with job_daemon(tmp_path) as client:
        for expected in (b"first\n", b"second\n"):
            text = expected.decode().strip()
            job = await client.wait((await client.start(["echo", text], job_id="same"))["job_id"])
            assert await client.log(job["job_id"]) == expected
            status, _ = await client.call("DELETE", "/v1/jobs/same")
            assert status == 200
