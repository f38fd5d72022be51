"""The pure run queue: specs, stacks, FIFO per group, steps, cancel."""

from __future__ import annotations

import pytest

from node.errors import RunError
from node.runs.queue import (
    RunRecord,
    RunSpec,
    RunState,
    RunStep,
    active_runs,
    cancel,
    new_run,
    next_seq,
    parse_run_spec,
    pending_in_group,
    with_step,
)

STACKS = {"tiny": {"nodes": 2, "role": "training"}}


def test_a_stack_fills_nodes_and_role() -> None:
    spec = parse_run_spec({"argv": ["train.py"], "stack": "tiny"}, STACKS)
    assert (spec.nodes, spec.role, spec.name) == (2, "training", "train.py")
    with pytest.raises(RunError) as caught:
        parse_run_spec({"argv": ["x"], "stack": "huge"}, STACKS)
    assert caught.value.code == "unknown_stack"
    assert "tiny" in caught.value.reason


@pytest.mark.parametrize(
    "body",
    [
        {"argv": []},
        {"argv": "train.py"},
        {"argv": ["x"], "nodes": 0},
        {"argv": ["x"], "max_duration_s": -1},
        {"argv": ["x"], "group": "no spaces"},
        {"argv": ["x"], "results": "out.txt"},
        {"argv": ["x"], "keep_alive": "yes"},
    ],
)
def test_bad_specs_are_refused_naming_the_field(body: dict[str, object]) -> None:
    with pytest.raises(RunError) as caught:
        parse_run_spec(body, STACKS)
    assert caught.value.status == 400


def test_each_group_runs_its_oldest_run_first_and_many_can_wait() -> None:
    runs: dict[str, RunRecord] = {}
    for index in range(150):
        group = "training" if index % 3 else "eval"
        record = new_run(RunSpec(("x",), group=group), next_seq(runs))
        runs[record.run_id] = record
    assert pending_in_group(runs, "training") == 100
    chosen = active_runs(runs)
    assert [r.seq for r in chosen] == [1, 2]  # eval's first, training's first
    second = next(r for r in runs.values() if r.seq == 5)
    runs[second.run_id] = with_step(second, RunStep.LOCKED, state="running")
    assert [r.seq for r in active_runs(runs)] == [1, 5]  # a started run keeps its turn


def test_cancel_ends_a_queued_run_and_marks_a_running_one() -> None:
    queued = new_run(RunSpec(("x",)), 1)
    assert cancel(queued).state is RunState.CANCELLED
    assert cancel(queued).step is RunStep.DONE
    running = with_step(queued, RunStep.RUNNING, state="running")
    marked = cancel(running)
    assert marked.cancel_requested is True
    assert marked.step is RunStep.RUNNING
    with pytest.raises(RunError) as caught:
        cancel(cancel(queued))
    assert caught.value.code == "run_ended"
    with pytest.raises(RunError):
        with_step(running, RunStep.LOCKED)
