"""`shoal jobs ...` as a user runs it: a child process against a real `shoal serve` with a
cluster secret, reached through the config file."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.cli.jobs import exit_status, gang_members
from tests.node.jobs.client_daemon import ROOT, ServedNode, child_env, served_node
from tests.node.jobs.test_gang import RANK_ONE_FAILS, cluster, coordinator_and_other

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedNode]:
    with served_node(tmp_path_factory.mktemp("jobs-cli")) as served:
        yield served


def shoal(
    node: ServedNode, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`shoal ARGS --config FILE` in a child process (the config comes first for `run`)."""
    command, rest = list(args[:2]), list(args[2:])
    return subprocess.run(
        [sys.executable, "-m", "node", *command, "--config", str(node.config_file), *rest],
        cwd=cwd or ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def start(node: ServedNode, *argv: str) -> str:
    result = shoal(node, "jobs", "run", "--", *argv)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_exit_status_is_what_a_shell_would_say() -> None:
    assert exit_status({"state": "succeeded", "exit_code": 0}) == (0, None)
    assert exit_status({"state": "failed", "exit_code": 3}) == (3, None)
    code, message = exit_status({"job_id": "j", "state": "failed", "signal": "TERM"})
    assert (code, message) == (143, "job j died of signal SIGTERM")
    code, message = exit_status({"job_id": "j", "state": "lost", "reason": "supervisor gone"})
    assert (code, message) == (1, "job j ended lost: supervisor gone")


def test_gang_members_are_one_line_each() -> None:
    record = {
        "gang": {
            "members": [
                {"rank": 0, "node": "n2", "job_id": "g.0", "state": "killed", "exit_code": None},
                {"rank": 1, "node": "n1", "job_id": "g.1", "state": "failed", "exit_code": 3},
            ]
        }
    }
    assert gang_members(record) == [
        "rank 0 on n2: job g.0 killed (exit code None)",
        "rank 1 on n1: job g.1 failed (exit code 3)",
    ]
    assert gang_members({"state": "running"}) == []


@pytest.mark.timeout(240)
async def test_run_wait_of_a_gang_exits_with_the_failing_members_code(tmp_path: Path) -> None:
    async with cluster(tmp_path) as three:
        clients = three.clients
        _, receiver = await coordinator_and_other(clients)
        config = tmp_path / "cli.yaml"
        config.write_text(json.dumps({"secret_file": str(tmp_path / "secret")}))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "node", "jobs", "run", "--config", str(config),
            "--node", clients[receiver].base, "--nodes", "3", "--wait",
            "--", sys.executable, "-c", RANK_ONE_FAILS,
            cwd=ROOT, env=child_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 180)
    stderr = err.decode()
    assert process.returncode == 3, stderr
    assert out == b""
    assert "failed (exit code 3)" in stderr
    assert stderr.count(" killed (exit code None)") == 2


def test_run_wait_streams_the_output_and_exits_with_the_job_exit_code(node: ServedNode) -> None:
    result = shoal(
        node, "jobs", "run", "--wait", "--env", "WHO=shoal", "--",
        "sh", "-c", 'echo "hello $WHO"; echo oops >&2; exit 3',
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert result.stdout == "hello shoal\n"
    assert "oops\n" in result.stderr
    ok = shoal(node, "jobs", "run", "--wait", "--", "echo", "fine")
    assert (ok.returncode, ok.stdout) == (0, "fine\n")
    quiet = shoal(node, "jobs", "run", "--wait", "--json", "--", "sh", "-c", "echo x; exit 5")
    assert quiet.returncode == 5
    assert (json.loads(quiet.stdout)["state"], json.loads(quiet.stdout)["exit_code"]) == (
        "failed",
        5,
    )


def test_run_wait_reports_a_signal_death_like_a_shell(node: ServedNode) -> None:
    result = shoal(node, "jobs", "run", "--wait", "--", "sh", "-c", "kill -KILL $$")
    assert result.returncode == 128 + 9
    assert "died of signal SIGKILL" in result.stderr


def test_run_wait_of_a_timed_out_job_exits_1_with_the_reason(node: ServedNode) -> None:
    result = shoal(node, "jobs", "run", "--wait", "--timeout", "0.5", "--", "sleep", "30")
    assert result.returncode == 1
    assert "ended timed_out" in result.stderr


def test_ctrl_c_during_run_wait_leaves_the_job_running_and_says_how_to_stop_it(
    node: ServedNode,
) -> None:
    command = [sys.executable, "-m", "node", "jobs", "run", "--config", str(node.config_file)]
    argv = ["--wait", "--", "sh", "-c", "echo started; sleep 30"]
    with subprocess.Popen(
        command + argv, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == b"started\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    stderr = err.decode()
    assert child.returncode == 130, stderr
    assert "stopped waiting; job " in stderr
    job_id = stderr.split("shoal jobs kill ")[1].split()[0]
    assert as_json(shoal(node, "jobs", "status", job_id, "--json"))["state"] == "running"
    assert shoal(node, "jobs", "kill", job_id, "--grace", "0").returncode == 0


def test_run_json_list_and_status_print_the_record(node: ServedNode) -> None:
    record = as_json(shoal(node, "jobs", "run", "--json", "--name", "json-shape", "--", "true"))
    fields = {"job_id", "name", "node", "argv", "state", "exit_code", "signal", "reason"}
    assert fields | {"created_at", "started_at", "ended_at", "pid", "log_bytes"} <= set(record)
    assert (record["name"], record["argv"], record["node"]) == ("json-shape", ["true"], "n1")
    job_id = record["job_id"]
    assert shoal(node, "jobs", "wait", job_id).returncode == 0
    listed = as_json(shoal(node, "jobs", "list", "--json", "--state", "succeeded"))
    assert job_id in [job["job_id"] for job in listed]
    status = as_json(shoal(node, "jobs", "status", job_id, "--json"))
    assert (status["state"], status["exit_code"]) == ("succeeded", 0)
    waited = shoal(node, "jobs", "wait", job_id, "--json")
    assert json.loads(waited.stdout)["state"] == "succeeded"
    text = shoal(node, "jobs", "status", job_id)
    assert text.returncode == 0
    assert "succeeded" in text.stdout


def test_logs_tail_stderr_and_follow(node: ServedNode) -> None:
    job_id = start(
        node, "sh", "-c", "for i in 1 2 3 4 5; do echo line $i; sleep 0.05; done; echo err >&2"
    )
    follow = shoal(node, "jobs", "logs", job_id, "-f")
    assert follow.stdout == "".join(f"line {i}\n" for i in range(1, 6))
    assert shoal(node, "jobs", "logs", job_id, "--tail", "2").stdout == "line 4\nline 5\n"
    assert shoal(node, "jobs", "logs", job_id, "--stderr").stdout == "err\n"


def test_kill_ends_a_running_job_killed_and_wait_says_so(node: ServedNode) -> None:
    job_id = start(node, "sh", "-c", "trap '' TERM; while :; do sleep 0.1; done")
    killed = as_json(shoal(node, "jobs", "kill", job_id, "--grace", "0.5", "--json"))
    assert (killed["job_id"], killed["state"]) == (job_id, "killed")
    waited = shoal(node, "jobs", "wait", job_id)
    assert waited.returncode == 1
    assert f"job {job_id} ended killed" in waited.stderr


def test_wait_with_a_timeout_exits_124_while_the_job_runs(node: ServedNode) -> None:
    job_id = start(node, "sleep", "30")
    result = shoal(node, "jobs", "wait", job_id, "--timeout", "0.3")
    assert result.returncode == 124
    assert "still running" in result.stderr
    assert shoal(node, "jobs", "kill", job_id, "--grace", "0").returncode == 0


def test_download_verifies_and_rm_removes(node: ServedNode, tmp_path: Path) -> None:
    job_id = start(node, "sh", "-c", "head -c 200000 /dev/urandom > out.bin; sha256sum out.bin")
    assert shoal(node, "jobs", "wait", job_id).returncode == 0
    fetched = as_json(shoal(node, "jobs", "download", job_id, "out.bin", str(tmp_path), "--json"))
    assert fetched["local"] == str(tmp_path / "out.bin")
    assert fetched["size_bytes"] == 200000
    digest = hashlib.sha256((tmp_path / "out.bin").read_bytes()).hexdigest()
    assert shoal(node, "jobs", "logs", job_id).stdout.split()[0] == digest
    here = tmp_path / "here"
    here.mkdir()
    plain = shoal(node, "jobs", "download", job_id, "out.bin", cwd=here)
    assert plain.returncode == 0, plain.stderr
    assert (here / "out.bin").read_bytes() == (tmp_path / "out.bin").read_bytes()
    escape = shoal(node, "jobs", "download", job_id, "../../x", str(tmp_path / "x"))
    assert escape.returncode == 1
    assert ": 400: " in escape.stderr
    assert not (tmp_path / "x").exists()
    assert as_json(shoal(node, "jobs", "rm", job_id, "--json")) == {
        "job_id": job_id,
        "removed": True,
    }
    gone = shoal(node, "jobs", "status", job_id)
    assert gone.returncode == 1
    assert ": 404: " in gone.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("jobs", "run", "--env", "NOEQUALS", "--", "true"), 2, "--env must be KEY=VALUE"),
        (("jobs", "run", "--role", "chef", "--", "true"), 2, "JobSpec.role must be one of"),
        (("jobs", "run", "--env-from", "rendezvous", "--", "true"), 1, ": 409: "),
        (("jobs", "status", "j-does-not-exist"), 1, "404"),
        (("jobs", "kill", "j-does-not-exist"), 1, "404"),
    ],
)
def test_bad_input_is_one_clear_line(
    node: ServedNode, args: tuple[str, ...], code: int, message: str
) -> None:
    result = shoal(node, *args)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert result.stderr.startswith("shoal: error: ")
    assert "Traceback" not in result.stderr


def test_an_unreachable_node_is_named(node: ServedNode) -> None:
    result = shoal(node, "jobs", "list", "--node", "http://127.0.0.1:9")
    assert result.returncode == 1
    assert "http://127.0.0.1:9/v1/jobs: unreachable" in result.stderr


def test_a_missing_config_file_exits_2(node: ServedNode, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "node", "jobs", "list", "--config", str(tmp_path / "none.yaml")],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "none.yaml" in result.stderr
