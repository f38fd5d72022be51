"""What the training page plots, as each daemon keeps it: its ranks' samples on the wall clock's
5 s grid, kept across restarts and bounded; its owned GPUs' utilization and memory in a ring of
15 minutes; and the group's histories merged from every node that ran a rank."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from node.training.gpus import MAX_GPUS, MAX_SAMPLES, GpuRing, GpuSampler, next_sample_at
from node.training.models import MAX_SCALARS, RankHistory, ReportsBody
from node.training.progress import HISTORY_S, MAX_PAST_RANKS, SAMPLE_S, ProgressStore
from node.training.view import merge_histories

WALL0 = 1_700_000_000.0


class Clocks:
    def __init__(self, wall: float = WALL0 + 1.3) -> None:
        self.wall_now = wall

    def mono(self) -> float:
        return self.wall_now - WALL0

    def wall(self) -> float:
        return self.wall_now


def body(rank: int, step: int, generation: int = 3, **extra: Any) -> ReportsBody:
    report = {"step": step, "at": 0.0, "compute_s": 0.1, "scalars": {"loss": 1.0 / (step + 1)}}
    fields = {"generation": generation, "rank": rank, "local_rank": 0, "world_size": 2, "pid": 7}
    return ReportsBody.model_validate(fields | {"reports": [report]} | extra)


def test_samples_fall_on_the_wall_clocks_grid_one_per_point() -> None:
    clocks = Clocks()
    store = ProgressStore("n1", 5, clock=clocks.mono, wall_clock=clocks.wall)
    for step in range(40):  # a report every 0.7 s for 28 s, starting 1.3 s into a point
        store.accept(body(0, step))
        clocks.wall_now += 0.7
    points = [int((at - WALL0) // SAMPLE_S) for at in store.history()["0"].at]
    assert points == list(range(6)), "one sample per point of the grid, none skipped"


def test_a_ranks_history_goes_on_across_a_restart_and_a_rank_gone_keeps_its_own() -> None:
    clocks = Clocks()
    store = ProgressStore("n1", 5, clock=clocks.mono, wall_clock=clocks.wall)
    store.set_generation(3)
    for step in range(3):
        store.accept(body(0, step))
        store.accept(body(1, step))
        clocks.wall_now += SAMPLE_S
    store.set_generation(4)
    store.accept(body(0, 0, generation=4))
    history = store.history()
    assert len(history["0"].at) == 4, "generation 3's samples and generation 4's"
    assert len(history["1"].at) == 3, "rank 1 runs elsewhere now: its past is still plotted"
    assert [r.rank for r in store.ranks()] == [0]
    clocks.wall_now += HISTORY_S
    store.accept(body(0, 1, generation=4))
    assert "1" not in store.history(), "out of the window"


def test_the_past_ranks_kept_are_bounded() -> None:
    clocks = Clocks()
    store = ProgressStore("n1", 5, clock=clocks.mono, wall_clock=clocks.wall)
    for generation in range(3, 3 + MAX_PAST_RANKS + 10):
        store.set_generation(generation)
        store.accept(body(generation, 1, generation=generation))
        clocks.wall_now += 1.0
    store.set_generation(10_000)
    assert len(store.history()) == MAX_PAST_RANKS


def test_a_rank_keeps_at_most_max_scalars_names() -> None:
    store = ProgressStore("n1", 5)
    for batch in range(3):
        names = {f"s{batch}-{i}": 1.0 for i in range(MAX_SCALARS)}
        report = {"step": batch, "at": 0.0, "scalars": names}
        store.accept(body(0, batch, reports=[report]))
    [progress] = store.ranks()
    assert len(progress.scalars) == MAX_SCALARS
    assert set(progress.scalars) == {f"s0-{i}" for i in range(MAX_SCALARS)}
    assert len(store.history()["0"].scalars) == MAX_SCALARS


def gpu(index: int, util: float | None = 50.0, used: float = 1000.0) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "name": "H100",
        "util_pct": util,
        "memory_used_mb": used,
        "memory_total_mb": 81559.0,
    }


def test_the_gpu_ring_keeps_15_minutes_of_the_owned_gpus_only() -> None:
    clocks = Clocks(WALL0)
    ring = GpuRing(wall_clock=clocks.wall)
    for n in range(MAX_SAMPLES + 30):
        ring.record([gpu(0, util=float(n % 100)), gpu(1), gpu(2)], owned=[0, 2])
        clocks.wall_now += SAMPLE_S
    zero, two = ring.history()
    assert (zero.index, two.index) == (0, 2)
    assert len(zero.at) == MAX_SAMPLES
    assert zero.at[-1] - zero.at[0] == HISTORY_S
    assert zero.util_pct[-1] == float((MAX_SAMPLES + 29) % 100)
    assert (zero.name, zero.uuid, zero.memory_total_mb) == ("H100", "GPU-0", 81559.0)
    ring.record([gpu(0, util=None)], owned=[0, 2])
    zero, two = ring.history()
    assert (zero.util_pct[-1], two.util_pct[-1]) == (None, None), "unread: a gap"
    many = GpuRing(wall_clock=clocks.wall)
    many.record([gpu(i) for i in range(MAX_GPUS + 8)], owned=range(MAX_GPUS + 8))
    assert len(many.history()) == MAX_GPUS


async def test_a_gpu_read_that_hangs_is_not_doubled_and_leaves_gaps() -> None:
    release = threading.Event()
    reads = []

    def read() -> list[dict[str, Any]]:
        reads.append(1)
        release.wait(10)
        return [gpu(0)]

    sampler = GpuSampler(GpuRing(), read, lambda: [0], deadline_s=0.05)
    assert await sampler.read() == ()
    assert await sampler.read() == (), "still hanging: no second read"
    assert len(reads) == 1
    release.set()
    await asyncio.sleep(0.1)
    assert await sampler.read() == [gpu(0)], "a new read once the last one ended"
    assert len(reads) == 2
    assert next_sample_at(WALL0 + 1.2) == WALL0 + SAMPLE_S


def test_a_ranks_history_from_two_nodes_is_merged_in_time_order() -> None:
    before = RankHistory(at=[10.0, 15.0], steps_per_s=[1, 1], compute_s=[0.1, 0.1], scalars={})
    after = RankHistory(at=[20.0], steps_per_s=[2.0], compute_s=[0.2], scalars={"loss": [0.5]})
    merged = merge_histories([{"3": after, "1": before}, {"3": before}])
    assert list(merged) == ["1", "3"]
    assert merged["3"].at == [10.0, 15.0, 20.0]
    assert merged["3"].steps_per_s == [1, 1, 2.0]
    assert merged["3"].scalars == {"loss": [None, None, 0.5]}
    assert merged["1"] == before
