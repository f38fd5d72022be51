"""bench/goodput_bench.py's pure parts: the seeded fault schedule and the score of a run (goodput,
steps lost, each fault's time to the group's next step) from examples/train.py's progress
lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.goodput_committed import committed_lost, wipe_restores
from bench.goodput_faults import FaultKind, schedule
from bench.goodput_score import AppliedFault, read_progress, score


def test_the_schedule_is_seeded_and_holds_every_kind_once_per_six_faults() -> None:
    planned = schedule(6, seed=7, hosts=4)
    assert planned == schedule(6, seed=7, hosts=4)
    assert planned != schedule(6, seed=8, hosts=4)
    assert [fault.at_s for fault in planned] == [30, 90, 150, 210, 270, 330]
    assert {fault.kind for fault in planned} == set(FaultKind)
    assert all(0 <= fault.host < 4 for fault in planned)
    assert len(schedule(3, seed=7, hosts=4)) == 3
    assert [f.at_s for f in schedule(0.75, seed=3, hosts=3, every_s=60, first_s=8)] == [8]
    with pytest.raises(ValueError, match="at least 2 hosts"):
        schedule(3, seed=7, hosts=1)


def steps(pid: int, generation: int, first: int, last: int, t: float) -> list[dict[str, Any]]:
    """Rank 0's step lines of one group, one every 0.1 s from `t`."""
    return [
        {"event": "step", "t": t + 0.1 * i, "pid": pid, "generation": generation, "step": s}
        for i, s in enumerate(range(first, last + 1))
    ]


def test_a_run_scores_goodput_losses_and_each_faults_time_to_the_next_step() -> None:
    lines = [
        *steps(1, 1, 1, 50, 1000.0),  # 1000.0 .. 1004.9
        *steps(1, 2, 51, 100, 1007.0),  # re-formed in place: nothing lost
        *steps(2, 0, 91, 150, 1014.0),  # restarted from step 90: steps 91..100 redone
    ]
    faults = [
        AppliedFault("worker_kill", "h1", 1005.0),
        AppliedFault("xid", "h2", 1010.0, applicable=False),
        AppliedFault("host_kill", "h3", 1012.0),
    ]
    result = score(lines, faults, end=1020.0)
    assert result.steps_lost == 10
    assert (result.first_step, result.final_step) == (1, 150)
    assert result.step_time_s == pytest.approx(0.1)
    assert result.goodput == pytest.approx(149 * 0.1 / 20.0)
    kill, xid, host = (fault.to_json() for fault in result.faults)
    assert (kill["to_next_step_s"], kill["steps_lost"], kill["at"]) == (2.0, 0, 5.0)
    assert (xid["to_next_step_s"], xid["kind"]) == ("n/a", "xid")
    assert (host["to_next_step_s"], host["steps_lost"]) == (2.0, 10)
    assert result.medians == {"worker_kill": 2.0, "xid": "n/a", "host_kill": 2.0}


def test_a_fault_the_group_never_recovered_from_has_no_time() -> None:
    lines = steps(1, 1, 1, 10, 1000.0)
    result = score(lines, [AppliedFault("worker_hang", "h0", 1000.5)], end=1010.0)
    assert result.faults[0].to_next_step_s is None
    assert result.to_json()["median_to_next_step_s"] == {"worker_hang": None}
    with pytest.raises(ValueError, match="never started"):
        score([], [], end=1.0)


def test_progress_files_are_read_in_time_order_skipping_a_torn_line(tmp_path: Path) -> None:
    (tmp_path / "h0-1.jsonl").write_text(
        json.dumps({"event": "step", "t": 2.0, "step": 2}) + "\n" + '{"event": "st'
    )
    (tmp_path / "h1-2.jsonl").write_text(json.dumps({"event": "start", "t": 1.0}) + "\n")
    assert [line["t"] for line in read_progress(tmp_path)] == [1.0, 2.0]


def test_a_group_that_resumes_below_the_step_committed_before_it_started_lost_steps() -> None:
    lines = [
        {"event": "start", "t": 100.0, "pid": 7},
        {"event": "restored", "t": 103.0, "pid": 7, "rank": 0, "step": 40},
        {"event": "restored", "t": 103.0, "pid": 8, "rank": 1, "step": 0},  # rank 1: not scored
        {"event": "start", "t": 200.0, "pid": 9},
        {"event": "restored", "t": 204.0, "pid": 9, "rank": 0, "step": 0},
    ]
    # 40 committed at 90 s, 60 at 150 s, 80 at 201 s (after pid 9 started: not owed to it)
    lost, restores = committed_lost(lines, [(90.0, 40), (150.0, 60), (201.0, 80)])
    assert lost == 60
    assert restores == [
        {"at": 103.0, "step": 40, "committed": 40},
        {"at": 204.0, "step": 0, "committed": 60},
    ]
    assert committed_lost(lines[:2], []) == (0, [{"at": 103.0, "step": 40, "committed": None}])


def test_a_wiped_hosts_restore_is_its_first_one_after_the_wipe() -> None:
    before = {"step": 20, "from": "local", "bytes": 10, "seconds": 0.1, "at": 50.0}
    after = {"step": 40, "from": "peers", "bytes": 10, "fetched_bytes": 10, "at": 70.0}
    answers = [{"restores": {"h1": before}}, {"restores": {"h1": after, "h2": None}}]
    assert wipe_restores(answers, [("h1", 60.0), ("h2", 60.0)], [(55.0, 30), (65.0, 40)]) == [
        {
            "host": "h1",
            "committed_before": 30,
            "restore": {"step": 40, "from": "peers", "bytes": 10, "fetched_bytes": 10,
                        "seconds": None},
        },
        {"host": "h2", "committed_before": 30, "restore": None},
    ]  # fmt: skip
