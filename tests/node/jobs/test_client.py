"""The Python job client (node.jobs.client) against a real `shoal serve` with a cluster secret;
its pure parts (specs, exit codes, hashes) without one; error handling against a small fake."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from node.errors import (
    DownloadHashError,
    JobClientError,
    JobEndedError,
    JobRequestError,
    JobWaitTimeoutError,
)
from node.jobs.client import (
    attach_job,
    download,
    download_async,
    list_jobs,
    poll_status,
    poll_status_async,
    remove_job,
    run_job,
    run_job_async,
    start_body,
    start_job,
    start_job_async,
    stream_logs,
    stream_logs_async,
    terminate,
    terminate_async,
    wait_for_completion,
    wait_for_completion_async,
)
from node.jobs.records import JobRecord, JobState, StreamBytes, StreamFlags
from node.jobs.specs import DeploySpec, JobSpec, make_job_state
from node.jobs.transport import ContentHasher, job_exit_code, signal_number
from node.providers import GPUQuery, LocalProvider
from tests.node.jobs.client_daemon import ServedNode, cutting_proxy, served_node
from tests.sync.files_fixtures import hash_file

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedNode]:
    with served_node(tmp_path_factory.mktemp("jobs-client")) as served:
        yield served


def ended_state(state: dict[str, Any]) -> str:
    """Wait for the job to end (whatever way) and return its final state."""
    with contextlib.suppress(JobEndedError):
        wait_for_completion(state, poll_interval=0.5, timeout_s=60)
    return str(state["status"])


# -- pure parts ---------------------------------------------------------------------------


def test_jobspec_takes_an_argv_tuple_never_a_shell_string() -> None:
    with pytest.raises(TypeError, match="argv tuple"):
        JobSpec("echo hi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        JobSpec(())
    with pytest.raises(ValueError, match="role"):
        JobSpec(("true",), role="chef")
    with pytest.raises(ValueError, match="timeout"):
        JobSpec(("true",), timeout=0)
    with pytest.raises(ValueError, match="env_from"):
        JobSpec(("true",), env_from="inventory")
    assert JobSpec(["echo", "hi"]).command == ("echo", "hi")  # type: ignore[arg-type]


def test_deployspec_takes_at_most_one_placement() -> None:
    with pytest.raises(ValueError, match="node_url, node_id"):
        DeploySpec(node_url="http://127.0.0.1:1", node_id="n2")
    with pytest.raises(TypeError, match="bootstrap"):
        DeploySpec(bootstrap="make setup")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="absolute workspace"):
        DeploySpec(bootstrap=("make", "setup"), workspace="run7")
    with pytest.raises(ValueError, match="absolute workspace"):
        DeploySpec(bootstrap=("make", "setup"))


def test_start_body_is_the_contract_body() -> None:
    job = JobSpec(
        ("python", "train.py"),
        env={"A": "1"},
        timeout=5.0,
        nodes=3,
        role="training",
        env_from="rendezvous",
    )
    body = start_body(job, DeploySpec(workspace="/w"), "j-1")
    assert body == {
        "job_id": "j-1",
        "name": "python",
        "argv": ["python", "train.py"],
        "env": {"A": "1"},
        "cwd": "/w",
        "timeout_s": 5.0,
        "nodes": 3,
        "role": "training",
        "env_from": "rendezvous",
    }
    assert start_body(JobSpec(("/bin/true",)), DeploySpec(), "j-2") == {
        "job_id": "j-2",
        "name": "true",
        "argv": ["/bin/true"],
    }


def test_exit_codes_are_exact_and_never_invented() -> None:
    assert job_exit_code({"state": "succeeded", "exit_code": 0}) == 0
    assert job_exit_code({"state": "failed", "exit_code": 3}) == 3
    assert job_exit_code({"state": "failed", "exit_code": None, "signal": "KILL"}) == -9
    for state in ("killed", "timed_out", "lost"):
        with pytest.raises(JobEndedError, match=state):
            job_exit_code({"job_id": "j", "state": state, "reason": "why", "exit_code": None})
    with pytest.raises(JobClientError, match="has not ended"):
        job_exit_code({"state": "running"})
    with pytest.raises(JobClientError, match="without an exit code"):
        job_exit_code({"state": "failed", "exit_code": None, "signal": None})
    assert [signal_number(v) for v in (15, "15", "TERM", "SIGTERM", None, "nope")] == [
        15,
        15,
        15,
        15,
        None,
        None,
    ]


def test_content_hasher_knows_plain_and_manifest_hashes(tmp_path: Path) -> None:
    data = bytes(range(256)) * 90  # 23,040 bytes: six pieces of 4 KiB
    path = tmp_path / "f"
    path.write_bytes(data)
    hasher = ContentHasher(piece_bytes=4096)
    for start in range(0, len(data), 1000):  # chunks that straddle piece boundaries
        hasher.update(data[start : start + 1000])
    _, manifest, _ = hash_file(path, 4096)
    assert manifest != hashlib.sha256(data).hexdigest()
    assert hasher.matches(manifest)
    assert hasher.matches("sha256:" + hashlib.sha256(data).hexdigest().upper())
    assert not hasher.matches(hashlib.sha256(data + b"x").hexdigest())


def test_ssh_mode_without_a_secret_says_what_to_configure(tmp_path: Path) -> None:
    config = tmp_path / "shoal.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    deploy = DeploySpec(ssh="gpu-1", config_file=str(config))
    with pytest.raises(JobClientError, match="no secret_file is configured"):
        start_job(deploy, JobSpec(("true",)), make_job_state())


async def test_provision_mode_runs_on_an_acquired_node_and_terminate_releases_it(
    tmp_path: Path,
) -> None:
    config = tmp_path / "shoal.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    async with LocalProvider(tmp_path / "provider", capacity=1) as provider:
        deploy = DeploySpec(provision=GPUQuery(count=0), provider=provider, config_file=str(config))
        state = make_job_state()
        await start_job_async(deploy, JobSpec(("sleep", "30")), state)
        [handle] = await provider.list()
        assert state["node_url"] == handle.url
        assert handle.state == "running"
        record = await terminate_async(state)
        assert record["state"] == "killed"
        assert await provider.list() == []  # released: the provider holds no node any more
        kept = DeploySpec(
            provision=GPUQuery(count=0), provider=provider, config_file=str(config),
            keep_alive=True,
        )  # fmt: skip
        async with run_job_async(kept, JobSpec(("true",))) as kept_state:
            assert await wait_for_completion_async(kept_state, poll_interval=0.5) == 0
        assert [h.state for h in await provider.list()] == ["running"]  # keep_alive keeps it


async def test_plain_functions_refuse_a_running_loop_and_name_the_async_twin() -> None:
    state = make_job_state()
    state.update(job_id="j", node_url="http://127.0.0.1:9")
    with pytest.raises(JobClientError, match="async twin"):
        poll_status(state)


# -- error handling against a fake node (a seam) --------------------------------------------


@contextlib.asynccontextmanager
async def fake_node(handler: Any) -> Any:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        state = make_job_state()
        state.update(job_id="j-fake", node_url=str(server.make_url("")).rstrip("/"))
        yield state
    finally:
        await server.close()


async def test_a_download_that_does_not_match_its_hash_leaves_no_file(tmp_path: Path) -> None:
    async def files(request: web.Request) -> web.Response:
        header = request.query["path"]
        digest = hashlib.sha256(b"other bytes").hexdigest() if header == "bad" else None
        headers = {"X-Shoal-Content-Hash": digest} if digest else {}
        return web.Response(body=b"payload", headers=headers)

    async with fake_node(files) as state:
        with pytest.raises(DownloadHashError, match="do not match"):
            await download_async(state, "bad", str(tmp_path))
        with pytest.raises(JobClientError, match="no X-Shoal-Content-Hash"):
            await download_async(state, "unhashed", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


async def test_the_server_reason_is_in_the_error() -> None:
    async def refuse(request: web.Request) -> web.Response:
        body = {"error": "not_found", "reason": "no job j-fake on n9", "status": 404}
        return web.json_response(body, status=404)

    async with fake_node(refuse) as state:
        with pytest.raises(JobRequestError, match="404: no job j-fake on n9") as caught:
            await wait_for_completion_async(state, poll_interval=0.1)
    assert caught.value.status == 404


def running_record(job_id: str) -> dict[str, object]:
    """The record a node answers for a job that runs."""
    return JobRecord(
        job_id=job_id,
        name="true",
        node="fake",
        argv=("true",),
        state=JobState.RUNNING,
        exit_code=None,
        signal=None,
        reason=None,
        created_at=1.0,
        started_at=1.5,
        ended_at=None,
        pid=4242,
        log_bytes=StreamBytes(stdout=0, stderr=0),
        log_capped=StreamFlags(stdout=False, stderr=False),
        max_log_bytes=1 << 20,
        cwd=None,
        timeout_s=None,
        nodes=1,
        role="any",
    ).to_json()


async def test_a_node_answering_no_job_record_is_named() -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"job_id": "j-fake", "state": "exploded"})

    async with fake_node(broken) as state:
        with pytest.raises(JobClientError, match="not a job record"):
            await poll_status_async(state)


async def test_a_start_whose_answer_is_lost_is_retried_with_the_same_job_id() -> None:
    seen: list[str] = []

    async def jobs(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body["job_id"])
        if len(seen) == 1:
            assert request.transport is not None
            request.transport.abort()  # the job may have started; its answer is lost
        return web.json_response(running_record(body["job_id"]), status=201)

    async with fake_node(jobs) as fake:
        state = make_job_state()
        deploy = DeploySpec(node_url=fake["node_url"])
        record = await start_job_async(deploy, JobSpec(("true",)), state)
    assert len(seen) == 2
    assert seen[0] == seen[1] == record["job_id"] == state["job_id"]
    assert state["status"] == "running"


async def test_wait_gives_up_after_its_timeout() -> None:
    async def running(request: web.Request) -> web.Response:
        return web.json_response(running_record("j-fake"))

    async with fake_node(running) as state:
        with pytest.raises(JobWaitTimeoutError, match="still running"):
            await wait_for_completion_async(state, poll_interval=0.05, timeout_s=0.2)


# -- against a real daemon ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected", "final"),
    [
        (("true",), 0, "succeeded"),
        (("sh", "-c", "exit 3"), 3, "failed"),
        (("sh", "-c", "kill -KILL $$"), -9, "failed"),
    ],
)
def test_wait_for_completion_returns_the_exact_exit_code(
    node: ServedNode, argv: tuple[str, ...], expected: int, final: str
) -> None:
    state = make_job_state()
    record = start_job(node.deploy(), JobSpec(argv), state)
    assert state["job_id"] == record["job_id"]
    assert state["node_url"] == node.url
    assert wait_for_completion(state, poll_interval=0.5) == expected
    assert state["status"] == final
    assert poll_status(state) == final


def test_stream_logs_yields_every_line_and_copies_them_to_the_log_file(
    node: ServedNode, tmp_path: Path
) -> None:
    copy = tmp_path / "copy.log"
    program = (
        "import sys, time\n"
        "for i in range(5):\n"
        "    print('line', i, flush=True); time.sleep(0.05)\n"
        "print('to stderr', file=sys.stderr)\n"
        "print('last', end='')\n"
    )
    job = JobSpec((sys.executable, "-c", program), log_file=str(copy))
    with run_job(node.deploy(), job) as state:
        lines = list(stream_logs(state))
    assert lines == [f"line {i}" for i in range(5)] + ["last"]
    assert copy.read_text() == "".join(line + "\n" for line in lines)
    assert state["status"] == "succeeded"  # run_job found it ended and left it alone
    assert list(stream_logs(state, follow=False, stream="stderr")) == ["to stderr"]
    assert list(stream_logs(state, follow=False, tail=2)) == ["line 4", "last"]


async def test_a_followed_log_cut_over_100_times_resumes_byte_identical(
    node: ServedNode,
) -> None:
    program = (
        "import sys, time\n"
        "for i in range(6000):\n"
        "    sys.stdout.write(f'{i:06d} ' + 'x' * 40 + '\\n')\n"
        "    if i % 200 == 0:\n"
        "        sys.stdout.flush(); time.sleep(0.01)\n"
    )
    expected = [f"{i:06d} {'x' * 40}" for i in range(6000)]
    state = make_job_state()
    await start_job_async(node.deploy(), JobSpec((sys.executable, "-c", program)), state)
    async with cutting_proxy(node, seed=13, max_cut_bytes=3000) as proxy:
        state["node_url"] = f"http://127.0.0.1:{proxy.port}"
        lines = [line async for line in stream_logs_async(state)]
    assert proxy.cuts >= 100
    assert lines == expected


@pytest.mark.parametrize("kill", [True, False], ids=["sigkill", "sigterm"])
async def test_a_followed_log_goes_on_across_a_daemon_restart(tmp_path: Path, kill: bool) -> None:
    program = (
        "import time\nfor i in range(60):\n    print(f'tick {i}', flush=True); time.sleep(0.05)\n"
    )
    with served_node(tmp_path / "restarted") as node:
        state = make_job_state()
        await start_job_async(node.deploy(), JobSpec((sys.executable, "-c", program)), state)
        lines: list[str] = []
        five = asyncio.Event()

        async def follow() -> None:
            async for line in stream_logs_async(state):
                lines.append(line)
                if len(lines) == 5:
                    five.set()

        follower = asyncio.create_task(follow())
        await asyncio.wait_for(five.wait(), 60)
        await asyncio.to_thread(node.stop, kill)  # either way the job keeps running
        await asyncio.sleep(1.0)  # the follower retries against a closed port meanwhile
        await asyncio.to_thread(node.start)
        await asyncio.wait_for(follower, 60)
        assert lines == [f"tick {i}" for i in range(60)]
        assert await wait_for_completion_async(state, poll_interval=0.5) == 0


def test_download_fetches_a_verified_file_and_refuses_an_escape(
    node: ServedNode, tmp_path: Path
) -> None:
    script = "printf hello > out.txt; mkdir -p sub; head -c 300000 /dev/urandom > sub/data.bin"
    state = make_job_state()
    start_job(node.deploy(), JobSpec(("sh", "-c", f"{script}; sha256sum sub/data.bin")), state)
    assert wait_for_completion(state, poll_interval=0.5) == 0
    assert download(state, "out.txt", str(tmp_path)) == tmp_path / "out.txt"
    assert (tmp_path / "out.txt").read_bytes() == b"hello"
    written = download(state, "sub/data.bin", str(tmp_path / "copy.bin"))
    announced = next(stream_logs(state, follow=False)).split()[0]
    assert hashlib.sha256(written.read_bytes()).hexdigest() == announced
    with pytest.raises(JobRequestError) as caught:
        download(state, "../../../etc/passwd", str(tmp_path / "passwd"))
    assert caught.value.status == 400
    assert not (tmp_path / "passwd").exists()


def test_terminate_ends_a_term_ignoring_job_killed(node: ServedNode) -> None:
    state = make_job_state()
    command = ("sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done")
    start_job(node.deploy(), JobSpec(command), state)
    with contextlib.closing(stream_logs(state)) as lines:
        assert next(lines) == "ready"
    final = terminate(state, grace_s=0.5)
    assert final["state"] == state["status"] == "killed"  # terminate returns once it ended
    assert final["signal"] == "SIGKILL"  # TERM was ignored; KILL after the grace
    with pytest.raises(JobEndedError, match="killed"):
        wait_for_completion(state, poll_interval=0.5, timeout_s=60)


def test_run_job_kills_a_job_still_running_at_exit_unless_keep_alive(node: ServedNode) -> None:
    with run_job(node.deploy(), JobSpec(("sleep", "60"))) as state:
        assert poll_status(state) in ("pending", "running")
    assert ended_state(state) == "killed"
    with run_job(node.deploy(keep_alive=True), JobSpec(("sleep", "60"))) as kept:
        pass
    assert poll_status(kept) == "running"
    terminate(kept, grace_s=0.0)
    assert ended_state(kept) == "killed"


def test_a_retried_start_is_harmless_and_a_different_spec_under_its_id_is_409(
    node: ServedNode,
) -> None:
    first = start_job(node.deploy(), JobSpec(("true",), job_id="j-retry-1"), make_job_state())
    again = start_job(node.deploy(), JobSpec(("true",), job_id="j-retry-1"), make_job_state())
    assert again["job_id"] == first["job_id"] == "j-retry-1"
    assert again["created_at"] == first["created_at"]
    with pytest.raises(JobRequestError) as caught:
        start_job(node.deploy(), JobSpec(("false",), job_id="j-retry-1"), make_job_state())
    assert caught.value.status == 409


def test_attach_list_and_remove_an_ended_job(node: ServedNode) -> None:
    started = make_job_state()
    start_job(node.deploy(), JobSpec(("true",), name="to-remove"), started)
    assert wait_for_completion(started, poll_interval=0.5) == 0
    state = attach_job(node.deploy(), started["job_id"])
    assert (state["status"], state["record"]) == ("pending", None)  # nothing asked yet
    assert poll_status(state) == "succeeded"
    assert state["record"]["name"] == "to-remove"
    listed = [job["job_id"] for job in list_jobs(node.deploy(), "succeeded")]
    assert started["job_id"] in listed
    assert started["job_id"] not in [job["job_id"] for job in list_jobs(node.deploy(), "failed")]
    remove_job(state)
    with pytest.raises(JobRequestError) as caught:
        poll_status(state)
    assert caught.value.status == 404


def test_requests_are_signed_and_an_unsigned_one_is_refused(node: ServedNode) -> None:
    state = make_job_state()
    start_job(node.deploy(), JobSpec(("true",)), state)
    unsigned = dict(state, secret_file=None)
    with pytest.raises(JobRequestError) as caught:
        poll_status(unsigned)
    assert caught.value.status == 401
    assert poll_status(state) in ("pending", "running", "succeeded")


def test_node_id_resolves_through_the_local_daemons_view(node: ServedNode) -> None:
    state = make_job_state()
    start_job(node.deploy(node_id="n1"), JobSpec(("true",)), state)
    assert state["node_url"] == node.url
    with pytest.raises(JobClientError, match=r"'n404' is not a member .*n1"):
        start_job(node.deploy(node_id="n404"), JobSpec(("true",)), make_job_state())


def test_bootstrap_runs_first_in_the_workspace_and_a_failing_one_stops_the_start(
    node: ServedNode, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    deploy = node.deploy(workspace=str(workspace), bootstrap=("sh", "-c", "echo boot > marker"))
    state = make_job_state()
    start_job(deploy, JobSpec(("cat", "marker")), state)
    assert wait_for_completion(state, poll_interval=0.5) == 0
    assert list(stream_logs(state, follow=False)) == ["boot"]
    failing = node.deploy(workspace=str(workspace), bootstrap=("sh", "-c", "exit 7"))
    never = make_job_state()
    with pytest.raises(JobClientError, match=r"bootstrap .* ended failed \(exit code 7"):
        start_job(failing, JobSpec(("true",), job_id="j-never"), never)
    with pytest.raises(JobRequestError) as caught:
        poll_status(never)
    assert caught.value.status == 404


async def test_async_twins_run_a_job_end_to_end(node: ServedNode) -> None:
    async with run_job_async(node.deploy(), JobSpec(("sh", "-c", "echo one; exit 4"))) as state:
        assert [line async for line in stream_logs_async(state)] == ["one"]
        assert await wait_for_completion_async(state, poll_interval=0.5) == 4
    assert state["status"] == "failed"
