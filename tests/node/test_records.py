"""The typed records of jobs, gangs, runs, locks and weights: each reads the JSON the previous
release wrote (captured from its code) and writes the same bytes back, and the OpenAPI document
a node serves shows each record's schema as its model generates it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from pydantic import BaseModel, TypeAdapter

from config import load_settings
from node.daemon import NodeDaemon
from node.jobs.records import GangRecord, GangSpec, JobRecord, JobState, PickAnswer
from node.jobs.routes import JobList
from node.locks.table import LOCK_ANSWER, LOCK_TABLE, Drain, LockAnswer, LockFence, LockTable
from node.locks.wire import LockView, Promise, Released, Stored
from node.rl.offers import OfferTaken, WeightsOffer, WeightsRuns, WeightsStatus
from node.runs.queue import RunList, RunRecord, RunState, RunStep

SHA = "ab" * 32
MEMBERS = (
    '[{"rank": 0, "node": "n0", "url": "http://10.0.0.0:8420", "job_id": "g-1.0", '
    '"state": "succeeded", "exit_code": 0, "signal": null, "reason": null, '
    '"ended_at": 1764000010.5}, {"rank": 1, "node": "n1", "url": "http://10.0.0.1:8420", '
    '"job_id": "g-1.1", "state": "failed", "exit_code": 3, "signal": null, '
    '"reason": "exited with code 3", "ended_at": 1764000011}]'
)
GANG = f'{{"members": {MEMBERS}, "fence": "3.5", "started_at": 1764000001.0, "master_port": 31037}}'
JOB = (
    '{"job_id": "j-1", "name": "python", "node": "n1", "argv": ["python", "-c", "print(1)"], '
    '"state": "failed", "exit_code": null, "signal": "SIGTERM", "reason": "died of SIGTERM", '
    '"created_at": 1764000000.125, "started_at": 1764000000.5, "ended_at": 1764000003.75, '
    '"pid": 4242, "log_bytes": {"stdout": 6, "stderr": 0}, '
    '"log_capped": {"stdout": false, "stderr": true}, "max_log_bytes": 1048576, "cwd": "sub", '
    '"timeout_s": 30.0, "nodes": 1, "role": "any"}'
)
GANG_JOB = (
    '{"job_id": "g-1", "name": "torchrun", "node": "n0", "argv": ["torchrun", "x.py"], '
    '"state": "failed", "exit_code": 3, "signal": null, "reason": "member rank 1 on n1 failed", '
    '"created_at": 1764000000.0, "started_at": 1764000001.0, "ended_at": 1764000012.0, '
    '"pid": null, "log_bytes": {"stdout": 0, "stderr": 0}, '
    '"log_capped": {"stdout": false, "stderr": false}, "max_log_bytes": 1048576, "cwd": null, '
    f'"timeout_s": null, "nodes": 2, "role": "training", "gang": {GANG}}}'
)
RESERVED_JOB = (
    '{"job_id": "g-2", "name": "torchrun", "node": "n0", "argv": ["torchrun", "x.py"], '
    '"state": "pending", "exit_code": null, "signal": null, "reason": null, '
    '"created_at": 1764000000, "started_at": null, "ended_at": null, "pid": null, '
    '"log_bytes": {"stdout": 0, "stderr": 0}, "log_capped": {"stdout": false, "stderr": false}, '
    '"max_log_bytes": 1048576, "cwd": null, "timeout_s": null, "nodes": 2, "role": "training", '
    '"gang": {"members": [], "started_at": null}}'
)
QUEUED_RUN = (
    '{"run_id": "run-20251124-160000-acfc69", "seq": 1, "argv": ["x"], "group": "training", '
    '"name": "", "nodes": 1, "role": "any", "stack": null, "keep_alive": false, '
    '"max_duration_s": null, "results": [], "state": "queued", "step": "queued", '
    '"submitted_at": 1764000000, "started_at": null, "ended_at": null, "fence": null, '
    '"job_node": null, "job_url": null, "started_nodes": [], "job": null, "uploaded": [], '
    '"cancel_requested": false, "safety_stop": false, "reason": null, "log": []}'
)
RUNNING_RUN = (
    '{"run_id": "run-20251124-160000-abc123", "seq": 7, "argv": ["python", "train.py"], '
    '"group": "training", "name": "train.py", "nodes": 2, "role": "training", "stack": "tiny", '
    '"keep_alive": false, "max_duration_s": 3600.0, "results": ["out.txt"], '
    '"state": "running", "step": "running", "submitted_at": 1764000000.5, '
    '"started_at": 1764000001.25, "ended_at": null, "fence": [3, 17], "job_node": "n1", '
    '"job_url": "http://10.0.0.1:8420", "started_nodes": ["n3"], "job": null, "uploaded": [], '
    '"cancel_requested": false, "safety_stop": false, "reason": null, "log": ['
    '{"at": 1795689260.089738, "step": "locked", "note": "lock runs.training granted, '
    'fence [3, 17]"}, {"at": 1795689260.0897408, "step": "starting", "note": "provider '
    'static: no stopped node to start"}, {"at": 1795689260.0897424, "step": "running", '
    '"note": "job run-x started"}, {"at": 1795689260.0897439, "step": "running", '
    '"note": "cancel requested"}], "nodes_to_start": ["n3"], "kill_sent": true}'
)
DONE_RUN = (
    '{"run_id": "run-20251124-160000-abc124", "seq": 8, "argv": ["torchrun", "x.py"], '
    '"group": "training", "name": "x", "nodes": 2, "role": "training", "stack": null, '
    '"keep_alive": true, "max_duration_s": null, "results": ["out.txt"], "state": "failed", '
    '"step": "done", "submitted_at": 1764000000.5, "started_at": 1764000001.25, '
    '"ended_at": 1764000020.5, "fence": [3, 18], "job_node": "n0", '
    f'"job_url": "http://10.0.0.0:8420", "started_nodes": [], "job": {GANG_JOB}, "uploaded": ['
    '{"key": "runs/run-20251124-160000-abc124/n0/out.txt", "size": 5, "hash": "' + SHA + '", '
    '"store": "local", "node": "n0", "path": "out.txt"}, {"key": '
    '"runs/run-20251124-160000-abc124/n1/out.txt", "missing": true, "node": "n1", '
    '"path": "out.txt"}], "cancel_requested": false, "safety_stop": false, "reason": null, '
    '"log": [{"at": 1764000020.5, "step": "done", "note": "kept alive (--keep-alive)"}], '
    '"nodes_to_start": []}'
)
CANCELLED_RUN = (
    '{"run_id": "run-20251124-160000-acfc69", "seq": 1, "argv": ["x"], "group": "training", '
    '"name": "", "nodes": 1, "role": "any", "stack": null, "keep_alive": false, '
    '"max_duration_s": null, "results": [], "state": "cancelled", "step": "done", '
    '"submitted_at": 1764000000, "started_at": null, "ended_at": 1795689260.0898616, '
    '"fence": null, "job_node": null, "job_url": null, "started_nodes": [], "job": null, '
    '"uploaded": [], "cancel_requested": false, "safety_stop": false, '
    '"reason": "cancelled while queued", "log": [{"at": 1795689260.0898628, "step": "done"}]}'
)
TABLE_PREVIOUS = (
    '{"version": [3, 17], "locks": {"a": {"holder": null, "fence": null, "ttl_s": 0.0, '
    '"expires_at": 0.0, "waiters": [{"holder": "w", "ttl_s": 10.0, '
    '"expires_at": 1764000011.0}]}, "runs.training": {"holder": "run-1", "fence": [3, 17], '
    '"ttl_s": 60.0, "expires_at": 1764000061.25, "waiters": [{"holder": "h2", "ttl_s": 30.0, '
    f'"expires_at": 1764000040.0}}]}}}}, "runs": {{"run-1": {QUEUED_RUN}}}}}'
)
"""A lock table as the previous release wrote it (no drains)."""
TABLE = (
    TABLE_PREVIOUS[:-1] + ', "drains": {"n3": {"kill_after_s": null, "by": "op"}}, '
    '"quarantines": {"n2": {"reason": "gpu_fault: Xid 79 on GPU-0", "since": 1764000005.0, '
    '"active": true, "times": [1764000005.0], "held": false}}, '
    '"checkpoints": {"committed": [], "restores": {}}}'
)
"""This release's: the drained nodes (`shoal node drain`), GPU quarantines and checkpoints too."""
OFFER = (
    '{"run": "r1", "version": 3, "params": [{"name": "w", "shape": [2, 3], "dtype": "float32", '
    '"nbytes": 24}], "total_bytes": 24, "deadline_s": 30.0, "sent_at": 1764000000.5, '
    '"group": {"master_addr": "10.0.0.1", "master_port": 29600, "prefix": "shoal/weights/r1"}, '
    f'"digest": {{"algo": "sha256", "value": "{SHA}"}}, "sha256": "{SHA}"}}'
)
OFFER_PWS = (
    '{"run": "r1", "version": 3, "params": [{"name": "w", "shape": [2, 3], "dtype": "float32", '
    '"nbytes": 24}], "total_bytes": 24, "deadline_s": 30.0, "sent_at": 0, "group": null, '
    '"digest": {"algo": "pws64", "value": "cdcdcdcdcdcdcdcd"}}'
)
STATUS = (
    f'{{"run": "r1", "version": 3, "digest": {{"algo": "sha256", "value": "{SHA}"}}, '
    f'"sha256": "{SHA}", "applied_at": 1764000002.5, "source": "broadcast", "bytes": 24}}'
)
STATUS_PWS = (
    '{"run": "r1", "version": 4, "digest": {"algo": "pws64", "value": "cdcdcdcdcdcdcdcd"}, '
    '"applied_at": 1764000002.5, "source": "file", "bytes": 24}'
)

CASES: list[tuple[type[BaseModel], str]] = [
    (JobRecord, JOB),
    (JobRecord, GANG_JOB),
    (JobRecord, RESERVED_JOB),
    (JobList, f'{{"jobs": [{GANG_JOB}, {JOB}]}}'),
    (GangRecord, GANG),
    (GangRecord, '{"members": [], "started_at": null}'),
    (
        GangRecord,
        f'{{"members": {MEMBERS}, "fence": "3.5", "started_at": null, "master_port": null}}',
    ),
    (
        GangSpec,
        '{"job_id": "g-1", "rank": 1, "nodes": 2, "master_addr": "10.0.0.0", '
        '"master_port": 31037, "owner": null}',
    ),
    (
        PickAnswer,
        '{"fence": "3.5", "members": [{"node_id": "c", "address": "10.0.0.3", "port": 8420}]}',
    ),
    (RunRecord, QUEUED_RUN),
    (RunRecord, RUNNING_RUN),
    (RunRecord, DONE_RUN),
    (RunRecord, CANCELLED_RUN),
    (RunList, f'{{"runs": [{QUEUED_RUN}, {DONE_RUN}]}}'),
    (LockView, '{"coordinator": "n1", ' + TABLE[1 : TABLE.index(', "checkpoints"')] + "}"),
    (Promise, f'{{"promised": 4, "table": {TABLE}}}'),
    (Released, '{"name": "a", "holder": "h", "released": true}'),
    (Stored, '{"stored": [3, 17]}'),
    (WeightsOffer, OFFER),
    (WeightsOffer, OFFER_PWS),
    (WeightsStatus, STATUS),
    (WeightsStatus, STATUS_PWS),
    (OfferTaken, '{"run": "r1", "version": 3, "offered": true}'),
]


@pytest.mark.parametrize(
    ("model", "text"), CASES, ids=[f"{m.__name__}{i}" for i, (m, _) in enumerate(CASES)]
)
def test_a_record_reads_the_json_written_before_and_writes_the_same_bytes(
    model: type[BaseModel], text: str
) -> None:
    assert json.dumps(json.loads(text)) == text, "the fixture is json.dumps' own output"
    record = model.model_validate(json.loads(text))
    assert json.dumps(record.model_dump(mode="json")) == text
    assert model.model_validate_json(text) == record


def test_lock_tables_and_answers_read_and_write_the_same_bytes() -> None:
    previous = LockTable.from_dict(json.loads(TABLE_PREVIOUS))
    assert previous.drains == {}, "a table of the previous release drains nobody"
    assert previous.quarantines == {}, "nor quarantines anybody"
    assert previous.checkpoints.newest is None, "nor has committed a checkpoint"
    assert json.dumps(previous.to_dict()) == (
        TABLE_PREVIOUS[:-1]
        + ', "drains": {}, "quarantines": {}, "checkpoints": {"committed": [], "restores": {}}}'
    )
    table = LockTable.from_dict(json.loads(TABLE))
    assert table.drains == {"n3": Drain(kill_after_s=None, by="op")}
    assert table.quarantines["n2"].active
    assert table.quarantines["n2"].times == (1764000005.0,)
    assert table.version == LockFence(3, 17)
    assert table.get("runs.training").fence == LockFence(3, 17)
    assert json.dumps(table.to_dict()) == TABLE
    for text in (
        '{"name": "a", "holder": "h", "granted": false, "fence": null, "position": 2, '
        '"expires_at": null}',
        '{"name": "a", "holder": "h", "granted": true, "fence": [3, 18], "position": 0, '
        '"expires_at": 1764000099.5}',
    ):
        answer = LockAnswer.from_dict(json.loads(text))
        assert json.dumps(answer.to_dict()) == text


def test_records_are_typed_and_frozen() -> None:
    run = RunRecord.model_validate_json(DONE_RUN)
    assert (run.step, run.state) == (RunStep.DONE, RunState.FAILED)
    assert run.job is not None
    assert run.job.gang is not None
    assert [m.state for m in run.job.gang.members] == [JobState.SUCCEEDED, JobState.FAILED]
    assert run.fence == LockFence(3, 18)
    with pytest.raises(ValueError, match="frozen"):
        run.step = RunStep.QUEUED  # type: ignore[misc]
    with pytest.raises(ValueError, match="step"):
        RunRecord.model_validate({**json.loads(QUEUED_RUN), "step": "sideways"})
    with pytest.raises(ValueError, match="state"):
        JobRecord.model_validate({**json.loads(JOB), "state": "exploded"})


def _without_defs(schema: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key != "$defs"}


async def _live_document() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shoal-records-") as tmp:
        flags = {"data_dir": Path(tmp), "node_id": "records", "port": 0, "mdns": False}
        settings = load_settings(env={}, flags=flags).settings
        async with NodeDaemon(settings) as daemon:
            url = f"http://127.0.0.1:{daemon.port}/v1/openapi.json"
            async with ClientSession() as session, session.get(url) as response:
                response.raise_for_status()
                document: dict[str, Any] = await response.json()
    return document


ANSWERS: list[tuple[str, str, str, type[BaseModel]]] = [
    ("post", "/v1/jobs", "201", JobRecord),
    ("get", "/v1/jobs", "200", JobList),
    ("get", "/v1/jobs/{job_id}", "200", JobRecord),
    ("get", "/v1/jobs/{job_id}/wait", "200", JobRecord),
    ("post", "/v1/jobs/{job_id}/kill", "200", JobRecord),
    ("post", "/v1/jobs/gang/pick", "200", PickAnswer),
    ("post", "/v1/runs", "201", RunRecord),
    ("get", "/v1/runs", "200", RunList),
    ("get", "/v1/runs/{run_id}", "200", RunRecord),
    ("post", "/v1/runs/{run_id}/cancel", "200", RunRecord),
    ("get", "/v1/locks", "200", LockView),
    ("post", "/v1/locks/{name}/release", "200", Released),
    ("post", "/v1/lockstore/prepare", "200", Promise),
    ("post", "/v1/lockstore/accept", "200", Stored),
    ("post", "/v1/weights/update", "200", OfferTaken),
    ("get", "/v1/weights/next", "200", WeightsOffer),
    ("post", "/v1/weights/applied", "200", WeightsStatus),
    ("get", "/v1/weights/status", "200", WeightsStatus),
    ("get", "/v1/weights/runs", "200", WeightsRuns),
]


async def test_the_openapi_schema_of_each_record_is_its_models_schema() -> None:
    document = await _live_document()
    components = document["components"]["schemas"]
    ref = "#/components/schemas/{model}"

    def answer_schema(method: str, path: str, status: str) -> dict[str, Any]:
        schema: dict[str, Any] = document["paths"][path][method]["responses"][status]["content"][
            "application/json"
        ]["schema"]
        return schema

    for method, path, status, model in ANSWERS:
        schema = answer_schema(method, path, status)
        assert schema == {"$ref": f"#/components/schemas/{model.__name__}"}, (method, path)
        generated = model.model_json_schema(ref_template=ref)
        assert components[model.__name__] == _without_defs(generated), model.__name__
        for name, definition in generated.get("$defs", {}).items():
            assert components[name] == definition, (model.__name__, name)
    lock_answer = LOCK_ANSWER.json_schema(ref_template=ref)
    for op in ("acquire", "renew"):
        assert answer_schema("post", f"/v1/locks/{{name}}/{op}", "200") == lock_answer
    table = TypeAdapter(LockTable).json_schema(ref_template=ref)
    assert components["LockTable"] == _without_defs(table)
    assert LOCK_TABLE.json_schema(ref_template=ref) == table
