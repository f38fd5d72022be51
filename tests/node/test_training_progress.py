"""A node's store of its ranks' reports: steps, when a rank last advanced, its rate, its recent
compute times, generations, and the last 15 minutes of samples."""

from __future__ import annotations

from typing import Any

from node.training.models import ReportsBody
from node.training.progress import HISTORY_S, SAMPLE_S, ProgressStore, summary


class Clocks:
    """A monotonic and a wall clock that move together."""

    def __init__(self) -> None:
        self.now = 1000.0

    def mono(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + 1_700_000_000.0


def body(
    rank: int, *steps: int, generation: int = 3, at: float | None = None, **extra: Any
) -> ReportsBody:
    reports = [
        {
            "step": step,
            "at": at or 0.0,
            "compute_s": 0.01 * (step + 1),
            "scalars": {"loss": 1.0 / (step + 1)},
        }
        for step in steps
    ]
    fields = {
        "generation": generation,
        "rank": rank,
        "local_rank": rank % 2,
        "world_size": 4,
        "pid": 100 + rank,
    }
    return ReportsBody.model_validate(fields | {"reports": reports} | extra)


def test_a_rank_advances_with_its_rate_compute_and_scalars() -> None:
    clocks = Clocks()
    store = ProgressStore(
        "n1", 3, gpu_of=lambda local: f"GPU-{local}", clock=clocks.mono, wall_clock=clocks.wall
    )
    store.set_generation(3)
    for step in range(5):
        assert store.accept(body(1, step, at=clocks.wall())) == 1
        clocks.now += 0.5
    [progress] = store.ranks()
    assert (progress.rank, progress.node, progress.local_rank, progress.step) == (1, "n1", 1, 4)
    assert progress.steps_per_s == 2.0
    assert progress.last_advance_age_s == 0.5
    assert progress.compute_samples == 3, "only the last straggler_window compute times"
    assert (progress.compute_min_s, progress.compute_s) == (0.03, 0.04)
    assert progress.scalars == {"loss": 0.2}
    assert (progress.gpu, progress.pid) == ("GPU-1", 101)
    assert store.reporting
    assert summary(store.ranks()) == {"generation": 3, "ranks": 1, "step": 4, "steps_per_s": 2.0}


def test_a_repeated_step_is_no_advance_and_old_report_times_are_kept() -> None:
    clocks = Clocks()
    store = ProgressStore("n1", 5, clock=clocks.mono, wall_clock=clocks.wall)
    store.accept(body(0, 7, at=clocks.wall()))
    clocks.now += 10
    store.accept(body(0, 7, at=clocks.wall() - 2))  # reported 2 s ago, posted now
    [progress] = store.ranks()
    assert (progress.last_advance_age_s, progress.last_report_age_s) == (10.0, 2.0)


def test_older_generations_are_refused_and_forgotten() -> None:
    clocks = Clocks()
    store = ProgressStore("n1", 5, clock=clocks.mono, wall_clock=clocks.wall)
    store.set_generation(3)
    store.accept(body(0, 1, generation=3))
    assert store.accept(body(1, 1, generation=2)) == 0, "a process of an older generation"
    assert store.accept(body(1, 1, generation=4)) == 1, "a newer one (its plan is not here yet)"
    store.set_generation(4)
    assert [r.rank for r in store.ranks()] == [1]
    clocks.now += 7
    assert store.generation_age_s() == 7.0
    assert summary([]) is None


def test_a_restarted_process_of_the_same_rank_starts_over() -> None:
    store = ProgressStore("n1", 5)
    store.accept(body(0, 50))
    store.accept(body(0, 3, pid=999))
    [progress] = store.ranks()
    assert (progress.step, progress.pid) == (3, 999)


def test_the_history_keeps_fifteen_minutes_of_samples() -> None:
    clocks = Clocks()
    store = ProgressStore("n1", 5, clock=clocks.mono, wall_clock=clocks.wall)
    samples = int(HISTORY_S / SAMPLE_S)
    for step in range(samples + 20):
        store.accept(body(2, step, at=clocks.wall()))
        clocks.now += SAMPLE_S
    history = store.history()["2"]
    assert len(history.at) == samples + 1
    assert history.at[-1] - history.at[0] == HISTORY_S
    assert len(history.steps_per_s) == len(history.compute_s) == len(history.scalars["loss"])
    assert history.steps_per_s[-1] == 1 / SAMPLE_S
