"""A start request's JSON (the job's spec.json and WAL entry) and the client's start body are
what their TypedDicts say, the same as before; a stored request reads back as itself, and one
with a malformed field is refused naming it."""

from __future__ import annotations

import json
import typing

import pytest

from node.errors import JobClientError, JobError
from node.jobs.documents import JobRecordJson, JobRequestJson, JobSpecJson
from node.jobs.gang_start import MemberStarts
from node.jobs.records import (
    GangMember,
    JobRecord,
    JobState,
    PickAnswer,
    PickedNode,
    StreamBytes,
    StreamFlags,
    parse_job_request,
    request_from_dict,
    state_of,
)
from node.jobs.specs import DeploySpec, JobSpec, JobStartBody, make_job_state, start_body
from node.jobs.transport import apply_record

REQUEST = parse_job_request(
    {"argv": ["python", "train.py"], "env": {"B": "2", "A": "1"}, "timeout_s": 60}
)


def test_a_request_is_stored_with_its_id_first_and_reads_back() -> None:
    request = REQUEST.with_id("j-1")
    data = request.to_dict()
    assert list(data) == ["job_id", *typing.get_type_hints(JobSpecJson)]
    assert set(data) == set(typing.get_type_hints(JobRequestJson))
    assert json.dumps(data) == (
        '{"job_id": "j-1", "name": "python", "argv": ["python", "train.py"], '
        '"env": {"A": "1", "B": "2"}, "cwd": null, "timeout_s": 60.0, "nodes": 1, '
        '"role": "any", "env_from": null, "gang": null}'
    )
    assert request_from_dict(json.loads(json.dumps(data))) == request
    assert request.spec() == REQUEST.spec()
    assert list(request.env) == ["A", "B"]


@pytest.mark.parametrize(
    ("field", "value"), [("argv", "python"), ("timeout_s", "long"), ("nodes", 0), ("env", {"A": 1})]
)
def test_a_stored_request_with_a_malformed_field_is_refused_naming_it(
    field: str, value: object
) -> None:
    with pytest.raises(JobError, match=field):
        request_from_dict({**REQUEST.with_id("j-1").to_dict(), field: value})


def test_a_start_body_leaves_out_the_fields_at_their_defaults() -> None:
    plain = start_body(JobSpec(("sleep", "1")), DeploySpec(), "j-2")
    assert plain == {"job_id": "j-2", "name": "sleep", "argv": ["sleep", "1"]}
    job = JobSpec(("t",), env={"X": "1"}, timeout=5.0, nodes=2, role="training",
                  env_from="rendezvous")  # fmt: skip
    full = start_body(job, DeploySpec(workspace="/w"), "j-3")
    assert set(full) == set(typing.get_type_hints(JobStartBody))
    assert parse_job_request(full).spec()["cwd"] == "/w"


def test_a_result_of_an_unknown_state_is_a_lost_job() -> None:
    result = {"state": "vanished", "exit_code": None, "signal": None, "reason": None,
              "started_at": None, "ended_at": 1.0}  # fmt: skip
    assert state_of(result, None) is JobState.LOST  # type: ignore[arg-type]
    assert state_of(None, {"started_at": 1.0, "pid": 3}) is JobState.RUNNING
    assert state_of(None, None) is JobState.PENDING


RECORD = JobRecord(
    job_id="j-1", name="t", node="n1", argv=("t",), state=JobState.FAILED, exit_code=3,
    signal=None, reason="exited with code 3", created_at=1.0, started_at=1.5, ended_at=2.0,
    pid=42, log_bytes=StreamBytes(stdout=1, stderr=0),
    log_capped=StreamFlags(stdout=False, stderr=False), max_log_bytes=1024, cwd=None,
    timeout_s=None, nodes=1, role="any",
)  # fmt: skip


def test_the_clients_record_is_a_job_records_json() -> None:
    assert set(typing.get_type_hints(JobRecordJson)) == set(JobRecord.model_fields)
    state = make_job_state()
    copied = apply_record(state, json.loads(json.dumps(RECORD.to_json())))
    assert copied == RECORD.to_json()
    assert set(copied) == set(typing.get_type_hints(JobRecordJson)) - {"gang"}
    assert (state["status"], state["exit_code"], state["node"]) == ("failed", 3, "n1")
    with pytest.raises(JobClientError, match="exit_code"):
        apply_record(make_job_state(), {**RECORD.to_json(), "exit_code": "three"})


async def test_a_gang_members_start_body_carries_the_gangs_spec() -> None:
    sent: list[object] = []

    async def call(
        method: str, url: str, body: object, headers: dict[str, str]
    ) -> tuple[int, object]:
        sent.append(body)
        return 201, {"state": "running"}

    pick = PickAnswer(fence="3:2", members=(PickedNode(node_id="a", address="10.0.0.1", port=1),))
    row = GangMember(rank=0, node="a", url="http://a", job_id="g-1-0", state=JobState.PENDING,
                     exit_code=None, signal=None, reason=None, ended_at=None)  # fmt: skip
    spec = REQUEST.spec()
    starts = MemberStarts(call, "g-1", "owner", spec, pick, [row])
    assert await starts.start_one(0, 29500) == (None, None)
    assert json.dumps(sent[0]) == json.dumps({
        "name": "python", "argv": ["python", "train.py"], "env": {"A": "1", "B": "2"},
        "cwd": None, "timeout_s": 60.0, "role": "any", "env_from": None, "job_id": "g-1-0",
        "nodes": 1, "gang": {"job_id": "g-1", "rank": 0, "nodes": 1, "master_addr": "10.0.0.1",
                             "master_port": 29500, "owner": "owner"},
    })  # fmt: skip
