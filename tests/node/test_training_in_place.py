"""`training_reform: in_place` on three daemons (127.0.0.1, `training_nproc: 2`, gloo), running
examples/train.py: a change of the group keeps the processes that still run, and no step is
redone.

- a worker SIGKILLed: its node starts it again alone; the other 5 processes stay (the same
  pids), re-form in the next generation and hand the newest step they hold in memory to the new
  process; every rank of the new group holds the same weights, and the group goes on from that
  step, not from the last committed checkpoint;
- a worker SIGSTOPped (a hang): the group restarts for `hang`, the stopped process is killed and
  started again, the other 5 stay, and again nothing is redone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.goodput_score import read_progress
from tests.cluster.fixtures import LoopbackClusterFactory
from tests.cluster.waiting import wait_until
from tests.node.test_training_cluster import TrainingCluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train.py"


class InPlaceCluster(TrainingCluster):
    def __init__(self, factory: LoopbackClusterFactory, base: Path) -> None:
        self.progress = base / "progress"
        self.progress.mkdir()
        command = [
            sys.executable,
            str(EXAMPLE),
            "--progress",
            str(self.progress),
            "--step-s",
            "0.05",
            "--save-s",
            "2",
        ]
        extra = {"training_reform": "in_place", "training_spares": 1}
        super().__init__(factory(3), base, {}, command=command, extra=extra)

    def lines(self, event: str | None = None) -> list[dict[str, Any]]:
        lines = read_progress(self.progress)
        return [line for line in lines if event is None or line["event"] == event]

    def steady(self) -> dict[str, Any] | None:
        """/v1/training once 6 ranks of one generation advance and no change is under way."""
        try:
            return self.advancing("h0")
        except OSError:
            return None


@pytest.fixture
def in_place(loopback_cluster: LoopbackClusterFactory, tmp_path: Path) -> Iterator[InPlaceCluster]:
    cluster = InPlaceCluster(loopback_cluster, tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()
        for line in cluster.lines("start"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(line["pid"], signal.SIGKILL)


def check_reformed_in_place(
    cluster: InPlaceCluster, view: dict[str, Any], victim: int, at: float
) -> dict[str, Any]:
    """Wait for the group to step in a generation above `view`'s after `victim` was hit at
    `at`; check that the other ranks kept their processes, that every rank of the new group
    holds the same state from the newest live step, and that no step was redone. The new
    generation's first rank-0 step line."""
    generation = view["generation"]
    survivors = {rank["pid"] for rank in view["ranks"]} - {victim}
    before = max((line["step"] for line in cluster.lines("step") if line["t"] <= at), default=0)

    def next_step() -> dict[str, Any] | None:
        return next(
            (
                line
                for line in cluster.lines("step")
                if line["generation"] > generation and line["t"] > at
            ),
            None,
        )

    first = wait_until(next_step, 90, 0.5, message="a step of the re-formed group")
    new_generation = first["generation"]
    reformed = [line for line in cluster.lines("reformed") if line["generation"] == new_generation]
    restored = [line for line in cluster.lines("restored") if line["generation"] == new_generation]
    # the survivors re-formed in their own processes; only the victim's place started again
    assert {line["pid"] for line in reformed} == survivors, (reformed, survivors)
    assert len(restored) == 1, restored
    assert restored[0]["pid"] not in survivors | {victim}, restored
    joined = reformed + restored
    assert sorted(line["rank"] for line in joined) == list(range(6)), joined
    # every rank went on from one live step, the newest any held, with the same weights
    steps = {line["step"] for line in joined}
    assert len(steps) == 1, (joined, before)
    assert steps.pop() >= before, (joined, before)
    assert len({line["digest"] for line in joined}) == 1, joined
    assert restored[0]["seconds"] < 30
    assert {line["source"] for line in reformed} <= {"memory", "peer"}
    # the first step of the new group follows the live step: nothing was redone
    assert first["step"] == joined[0]["step"] + 1, (first, joined[0])
    return first


@pytest.mark.timeout(420)
def test_a_killed_and_a_stopped_worker_are_replaced_while_the_others_keep_their_state(
    in_place: InPlaceCluster,
) -> None:
    cluster = in_place
    view = wait_until(cluster.steady, 180, 1.0, message="6 ranks advancing")
    victim = next(rank for rank in view["ranks"] if rank["node"] == "h2")
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.time()
    first = check_reformed_in_place(cluster, view, victim["pid"], killed_at)
    print(f"worker SIGKILL to the next step: {first['t'] - killed_at:.2f} s")

    view = wait_until(cluster.steady, 120, 1.0, message="6 ranks advancing again")
    hung = next(rank for rank in view["ranks"] if rank["node"] == "h1")
    os.kill(hung["pid"], signal.SIGSTOP)
    stopped_at = time.time()
    first = check_reformed_in_place(cluster, view, hung["pid"], stopped_at)
    print(f"worker SIGSTOP to the next step: {first['t'] - stopped_at:.2f} s")
    restarts = cluster.view("h0")["restarts"]
    assert any(restart["reason"] == "hang" for restart in restarts), restarts
