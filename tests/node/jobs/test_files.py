"""The files of a job's directory are what their TypedDicts (node.jobs.files) say, and the
daemon reads a malformed supervisor.json or result.json as such, naming the field."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from config import JobSettings
from node.jobs import JobService, parse_job_request
from node.jobs.files import read_result, read_started, result_from_json, started_from_json
from node.jobs.filetypes import JobResultJson, LaunchJson, StartedJson
from node.jobs.records import JobState
from wal import WriteAheadLog

RESULT: JobResultJson = {
    "state": "failed",
    "exit_code": 3,
    "signal": None,
    "reason": "exited with code 3",
    "started_at": 1.5,
    "ended_at": 2.0,
}


def keys_of(document: type) -> tuple[set[str], set[str]]:
    """(every key, the required keys) of a TypedDict."""
    return set(typing.get_type_hints(document)), set(document.__required_keys__)  # type: ignore[attr-defined]


def assert_shaped(data: dict[str, object], document: type) -> None:
    every, required = keys_of(document)
    assert required <= set(data) <= every, (document.__name__, sorted(data))


async def test_a_jobs_files_have_the_keys_of_their_typed_dicts(tmp_path: Path) -> None:
    jobs = JobService("n", JobSettings(), tmp_path / "jobs", daemon_url=lambda: "http://x")
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        await jobs.open(wal)
        try:
            await jobs.start(parse_job_request({"job_id": "j1", "argv": ["sh", "-c", "exit 3"]}))
            entry = await jobs.wait("j1", 30)
        finally:
            await jobs.close()
    directory = tmp_path / "jobs" / "j1"
    files = {name: json.loads((directory / name).read_text()) for name in
             ("launch.json", "supervisor.json", "result.json")}  # fmt: skip
    assert_shaped(files["launch.json"], LaunchJson)
    assert_shaped(files["supervisor.json"], StartedJson)
    assert_shaped(files["result.json"], JobResultJson)
    assert result_from_json(files["result.json"]) == files["result.json"]
    assert started_from_json(files["supervisor.json"]) == files["supervisor.json"]
    assert files["result.json"]["log_capped"] == {"stdout": False, "stderr": False}
    assert (entry.state, entry.record(1024).exit_code) == (JobState.FAILED, 3)


@pytest.mark.parametrize(
    ("field", "value"),
    [("state", None), ("exit_code", "3"), ("exit_code", 2.5), ("signal", 9), ("reason", ["x"]),
     ("started_at", "soon"), ("ended_at", None), ("ended_at", True), ("log_capped", [])],
)  # fmt: skip
def test_a_malformed_result_is_refused_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"result.json: {field} is"):
        result_from_json({**RESULT, field: value})


@pytest.mark.parametrize(
    ("field", "value"), [("pid", "12"), ("pid", True), ("started_at", {}), ("start_ticks", 1.5)]
)
def test_a_malformed_start_is_refused_naming_its_field(field: str, value: object) -> None:
    started = {"started_at": 1.0, "pid": 12, "supervisor_pid": 11, "pgid": 12, "start_ticks": 7}
    with pytest.raises(ValueError, match=f"supervisor.json: {field} is"):
        started_from_json({**started, field: value})


def test_a_malformed_result_file_is_a_lost_end_that_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    assert read_result(path) is None
    path.write_text(json.dumps({**RESULT, "exit_code": "three"}))
    result = read_result(path)
    assert result is not None
    assert (result["state"], result["exit_code"]) == ("lost", None)
    assert result["reason"] == "exit status unreadable: result.json: exit_code is 'three'"
    path.write_text(json.dumps(RESULT))
    assert read_result(path) == RESULT


def test_a_malformed_start_file_says_started_with_no_pid(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.json"
    assert read_started(path) is None
    path.write_text(json.dumps({"started_at": 1.0, "pid": "12"}))
    assert read_started(path) == {"started_at": None, "pid": None}
