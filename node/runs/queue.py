"""Queued runs as plain data: a run's spec and record, its steps, and the pure decisions of the
queue (what to submit, which run of a group goes next, what a cancel does).

Steps, in order: queued -> locked -> starting (the job's node chosen and stored before the job
is started, so a failover never starts it twice) -> running -> collecting -> stopping -> done.
"""

from __future__ import annotations

import enum
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, Field, JsonValue

from node.errors import BodyError, LockError, RunError
from node.jobs import JobRecord
from node.locks.table import LockFence, WireFence
from node.openapi import BODY_CONFIG, Number, WholeNumber, WireRecord, check_body


class RunStep(enum.StrEnum):
    """Where the queue is with a run, in order; a run never goes back a step."""

    QUEUED = "queued"
    LOCKED = "locked"
    STARTING = "starting"
    RUNNING = "running"
    COLLECTING = "collecting"
    STOPPING = "stopping"
    DONE = "done"


class RunState(enum.StrEnum):
    """A run's state: queued, running, then how it ended (its job's end, or cancelled)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    KILLED = "killed"
    TIMED_OUT = "timed_out"
    LOST = "lost"


STEPS = tuple(step.value for step in RunStep)
ENDED = frozenset(state.value for state in RunState) - {"queued", "running"}
MAX_PENDING = 1000
"""Queued runs kept per concurrency group; a submit beyond this is refused (429)."""
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def run_lock(group: str) -> str:
    """The lock a group's running run holds."""
    return f"runs.{group}"


@dataclass(frozen=True)
class RunSpec:
    """What `POST /v1/runs` asks for."""

    argv: tuple[str, ...]
    group: str = "training"
    name: str = ""
    nodes: int = 1
    role: str = "any"
    stack: str | None = None
    keep_alive: bool = False
    max_duration_s: float | None = None
    results: tuple[str, ...] = ()


def _bad(reason: str) -> RunError:
    return RunError(400, "invalid_run", reason)


class RunBody(BaseModel):
    """Body of `POST /v1/runs`; a `stack` of the inventory then fills `nodes` and `role`."""

    model_config = BODY_CONFIG

    argv: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description="the command and its arguments (non-empty strings)"
    )
    group: str = Field(
        default="training", pattern=_NAME.pattern, description="the concurrency group"
    )
    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]{0,64}$",
        description="1 to 64 letters, digits, '.', '_' or '-' (default: argv[0]'s base name)",
    )
    nodes: WholeNumber = Field(default=1, ge=1, le=1024, description="an integer from 1 to 1024")
    role: str = Field(default="any", min_length=1, description="a role name")
    stack: str | None = Field(default=None, description="a stack of the inventory")
    keep_alive: bool = False
    max_duration_s: float | None = Field(
        default=None, gt=0, description="a positive number of seconds"
    )
    results: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="paths relative to the job's working directory"
    )


class CancelBody(BaseModel):
    """Body of `POST /v1/runs/{run_id}/cancel` (optional): an empty object."""

    model_config = BODY_CONFIG


def parse_run_spec(body: object, stacks: Mapping[str, Mapping[str, Any]]) -> RunSpec:
    """A RunSpec from a request body (decoded JSON), checked by RunBody; a `stack` fills
    `nodes` and `role` from the inventory's stacks. RunError 400 naming the field otherwise."""
    try:
        run = check_body(RunBody, body)
    except BodyError as exc:
        raise _bad(exc.reason) from None
    name = run.name or run.argv[0].rsplit("/", 1)[-1]
    if not _NAME.fullmatch(name):
        raise _bad(f"name: 1 to 64 letters, digits, '.', '_' or '-', not {name!r}")
    nodes: object = run.nodes
    role: object = run.role
    if run.stack is not None:
        if run.stack not in stacks:
            known = ", ".join(sorted(stacks)) or "none in the inventory"
            raise RunError(400, "unknown_stack", f"stack {run.stack!r} is not defined ({known})")
        nodes = stacks[run.stack].get("nodes", nodes)
        role = stacks[run.stack].get("role", role)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 1024:
        raise _bad(f"nodes: an integer from 1 to 1024, not {nodes!r}")
    if not isinstance(role, str) or not role:
        raise _bad(f"role: a role name, not {role!r}")
    return RunSpec(
        tuple(run.argv),
        run.group,
        name,
        nodes,
        role,
        run.stack,
        run.keep_alive,
        run.max_duration_s,
        tuple(run.results),
    )


class RunLogLine(WireRecord):
    """A line of a run's log: when it reached `step`, and why (no `note`: nothing to say)."""

    at: Number
    step: RunStep
    note: str | None = Field(default=None, exclude_if=lambda note: note is None)


class RunRecord(WireRecord):
    """A queued run's record, stored with the locks on the voters' majority: its spec, where
    the queue is with it (`step`), its job (once it ran), the results it uploaded and its log.
    `nodes_to_start` and `kill_sent` are left out of the JSON until they are set."""

    run_id: str
    seq: int
    argv: tuple[str, ...]
    group: str
    name: str
    nodes: int
    role: str
    stack: str | None
    keep_alive: bool
    max_duration_s: Number | None
    results: tuple[str, ...]
    state: RunState
    step: RunStep
    submitted_at: Number
    started_at: Number | None
    ended_at: Number | None
    fence: WireFence | None = Field(description="the run lock's fence [term, seq]")
    job_node: str | None
    job_url: str | None
    started_nodes: tuple[str, ...]
    job: JobRecord | None = Field(description="the job's record once it ended")
    uploaded: tuple[dict[str, JsonValue], ...] = Field(
        description="each result file as its store recorded it, with node and path"
    )
    cancel_requested: bool
    safety_stop: bool
    reason: str | None
    log: tuple[RunLogLine, ...]
    nodes_to_start: tuple[str, ...] | None = Field(
        default=None, exclude_if=lambda nodes: nodes is None
    )
    kill_sent: bool = Field(default=False, exclude_if=lambda sent: not sent)


class RunList(WireRecord):
    """The answer of `GET /v1/runs`: every run, oldest first."""

    runs: tuple[RunRecord, ...]


def new_run(spec: RunSpec, seq: int, now: float | None = None) -> RunRecord:
    """The record of a run just queued (the `seq`-th submission: FIFO order)."""
    run_id = f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"
    return RunRecord(
        run_id=run_id,
        seq=seq,
        argv=spec.argv,
        group=spec.group,
        name=spec.name,
        nodes=spec.nodes,
        role=spec.role,
        stack=spec.stack,
        keep_alive=spec.keep_alive,
        max_duration_s=spec.max_duration_s,
        results=spec.results,
        state=RunState.QUEUED,
        step=RunStep.QUEUED,
        submitted_at=time.time() if now is None else now,
        started_at=None,
        ended_at=None,
        fence=None,
        job_node=None,
        job_url=None,
        started_nodes=(),
        job=None,
        uploaded=(),
        cancel_requested=False,
        safety_stop=False,
        reason=None,
        log=(),
    )


def pending_in_group(runs: Mapping[str, RunRecord], group: str) -> int:
    return sum(1 for r in runs.values() if r.group == group and r.step is RunStep.QUEUED)


def next_seq(runs: Mapping[str, RunRecord]) -> int:
    return 1 + max((r.seq for r in runs.values()), default=0)


def active_runs(runs: Mapping[str, RunRecord]) -> list[RunRecord]:
    """Per group, the one run the queue drives now: the group's run past `queued` if any, else
    its oldest queued run (FIFO by `seq`)."""
    chosen: dict[str, RunRecord] = {}
    for record in sorted(runs.values(), key=lambda r: r.seq):
        if record.step is RunStep.DONE:
            continue
        current = chosen.get(record.group)
        if current is None or (
            current.step is RunStep.QUEUED and record.step is not RunStep.QUEUED
        ):
            chosen[record.group] = record
    return [chosen[g] for g in sorted(chosen)]


def with_step(record: RunRecord, step: RunStep, **changes: Any) -> RunRecord:
    """The record moved to `step` (never backwards), with a line in its log; `changes` are
    other fields (checked: RunRecord's types), `note` the log line's note."""
    order = list(RunStep)
    if order.index(step) < order.index(record.step):
        raise RunError(409, "run_step_backwards", f"run {record.run_id}: {record.step} -> {step}")
    note = changes.pop("note", None)
    line = RunLogLine(at=time.time(), step=step, note=note or None)
    data = {**record.model_dump(), **changes, "step": step, "log": (*record.log, line)}
    return RunRecord.model_validate(data)


def cancel(record: RunRecord) -> RunRecord:
    """A queued run ends `cancelled` at once; a running one is marked to be killed (its results
    are still collected); an ended run cannot be cancelled (RunError 409)."""
    if record.step is RunStep.DONE:
        raise RunError(409, "run_ended", f"run {record.run_id} already ended {record.state}")
    if record.step is RunStep.QUEUED:
        return with_step(
            record,
            RunStep.DONE,
            state=RunState.CANCELLED,
            ended_at=time.time(),
            reason="cancelled while queued",
        )
    return record.model_copy(update={"cancel_requested": True})


def final_state(run: RunRecord) -> RunState:
    if run.cancel_requested:
        return RunState.CANCELLED
    if run.safety_stop:
        return RunState.KILLED
    return RunState(run.job.state.value) if run.job is not None else RunState.LOST


def fence_of(run: RunRecord) -> LockFence:
    """The fence of the run's lock; LockError 400 for a run that has none (never locked)."""
    if run.fence is None:
        raise LockError(400, "bad_fence", f"run {run.run_id} holds no lock fence")
    return run.fence
