"""The training page's data: the `training` topic (the group now) and the `training_history`
window (every rank's and GPU's last 15 minutes on one grid, bounded), sent whole to a page once
and then as its newest points only."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from node.locks.table import Quarantine
from node.training.models import (
    MAX_SCALARS,
    GpuHistory,
    RankHistory,
    RankProgress,
    Restart,
    RestartReason,
    TrainingView,
)
from node.ui.events import EventHub, Window
from node.ui.training import (
    BIN_S,
    BINS,
    MAX_RANKS,
    TAIL_BINS,
    history_document,
    now_document,
    quarantine_rows,
    training_topics,
    training_windows,
    window_of,
)

NOW = 1_700_000_003.0
"""A moment 3 s into a point of the 5 s grid."""
NEWEST = 1_700_000_000.0


def rank(number: int, **fields: Any) -> RankProgress:
    base: dict[str, Any] = {
        "rank": number,
        "node": "gpu-host-1",
        "local_rank": number,
        "generation": 3,
        "step": 120,
        "steps_per_s": 3.98765,
        "last_report_age_s": 0.2,
        "last_advance_age_s": 0.7,
        "compute_s": 0.2012345,
        "scalars": {"loss": 0.4123456},
    }
    return RankProgress(**(base | fields))


def view(**fields: Any) -> TrainingView:
    base: dict[str, Any] = {
        "answered_by": "gpu-host-1",
        "coordinator": "gpu-host-1",
        "generation": 3,
        "world_size": 2,
        "hung": False,
        "hang_timeout_s": 60.0,
        "ranks": [rank(0), rank(1, straggler=True, compute_s=0.61)],
        "restarts": [
            Restart(at=NEWEST - 120, generation=3, reason=RestartReason.HANG, detail="stuck")
        ],
    }
    return TrainingView(**(base | fields))


def samples(points: int, start: float = NEWEST - 10, **scalars: float) -> RankHistory:
    at = [start + i * BIN_S + 0.4 for i in range(points)]
    return RankHistory(
        at=at,
        steps_per_s=[4.0] * points,
        compute_s=[0.2] * points,
        scalars={name: [value] * points for name, value in scalars.items()},
    )


def test_the_now_document_carries_what_the_page_marks_and_shows_beside_each_plot() -> None:
    document = now_document(view(hung=True))
    assert document["hung"] is True
    first, second = document["ranks"]
    assert (first["steps_per_s"], first["compute_s"]) == (3.988, 0.2012), "4 significant digits"
    assert first["scalars"] == {"loss": 0.4123}
    assert (first["straggler"], second["straggler"]) == (False, True)
    assert first["last_advance_age_s"] == 1, "whole seconds: the text changes once a second"
    assert document["restarts"][0]["reason"] == "hang"


def test_the_now_document_sums_up_each_node_and_names_one_missing() -> None:
    ranks = [rank(0, step=120), rank(1, step=118, straggler=True), rank(2, node="h2", step=121)]
    nodes = now_document(view(ranks=ranks, missing=["h3"]))["nodes"]
    assert [row["node"] for row in nodes] == ["gpu-host-1", "h2", "h3"]
    first, second, third = nodes
    assert (first["ranks"], first["step_min"], first["step_max"]) == ([0, 1], 118, 120)
    assert first["steps_per_s"] == 7.975, "the node's ranks' rates summed"
    assert first["stragglers"] == [1]
    assert (second["ranks"], "stragglers" in second) == ([2], False)
    assert (third["reachable"], "ranks" in third) == (False, False)


def test_the_gpu_quarantine_lists_the_plans_nodes_then_the_readmitted() -> None:
    records = {
        "h1": Quarantine("gpu_fault: Xid 79 on GPU-1", NEWEST - 60, True, (NEWEST - 60,)),
        "h2": Quarantine("gpu_fault: Xid 48 on GPU-2", NEWEST - 900, False, (NEWEST - 900,)),
        "h4": Quarantine("gpu_fault: Xid 79 on GPU-4", NEWEST, True, (1.0, 2.0, 3.0), True),
    }
    plan = {"h1": "gpu_fault: Xid 79 on GPU-1", "h4": "held: undrain h4 to re-admit it"}
    rows = quarantine_rows(plan, records)
    assert [(r["node"], r["state"]) for r in rows] == [
        ("h1", "quarantined"),
        ("h4", "held"),
        ("h2", "readmitted"),
    ]
    assert rows[0]["reason"] == "gpu_fault: Xid 79 on GPU-1"
    assert (rows[1]["times"], rows[1]["held"], rows[1]["reason"]) == (3, True, plan["h4"])
    assert rows[2]["since"] == NEWEST - 900
    assert quarantine_rows({"h9": "gpu_fault: Xid 79"}, {})[0]["since"] is None, "plan only"
    [pending] = quarantine_rows({}, {"h1": records["h1"]})
    assert pending["state"] == "quarantined", "in the table: the next plan keeps it out"
    document = now_document(view(), rows)
    assert document["quarantine"] == rows


def test_history_lies_on_one_grid_of_15_minutes_ending_now() -> None:
    history = {"0": samples(3, loss=0.5), "1": samples(1, start=NEWEST - 20 * 60, loss=9.0)}
    gpus = GpuHistory(
        index=0,
        uuid="GPU-1",
        name="H100",
        memory_total_mb=81559.0,
        at=[NEWEST - 5 + 0.1, NEWEST + 0.1],
        util_pct=[91.0, None],
        memory_used_mb=[40000.0, 41000.0],
    )
    document = history_document(view(history=history, gpu_history={"h1": [gpus]}), NOW)
    assert (document["bins"], document["bin_s"], document["tail"]) == (BINS, BIN_S, False)
    assert document["t0"] == NEWEST - (BINS - 1) * BIN_S
    zero = document["ranks"]["0"]
    assert len(zero["steps_per_s"]) == BINS
    assert zero["steps_per_s"][-3:] == [4.0, 4.0, 4.0], "samples at -10, -5 and 0 s"
    assert zero["steps_per_s"][:-3] == [None] * (BINS - 3)
    assert zero["scalars"]["loss"][-1] == 0.5
    assert document["ranks"]["1"]["scalars"]["loss"] == [None] * BINS, "older than the window"
    [gpu] = document["gpus"]["h1"]
    assert gpu["util_pct"][-2:] == [91.0, None]
    assert gpu["memory_used_mb"][-2:] == [40000.0, 41000.0]
    assert gpu["memory_total_mb"] == 81559.0


def test_history_is_bounded_in_ranks_and_scalars() -> None:
    many = {name: 1.0 for name in (f"s{i:02d}" for i in range(MAX_SCALARS + 8))}
    history = {str(r): samples(1, **many) for r in range(MAX_RANKS + 5)}
    document = history_document(view(history=history), NOW)
    assert len(document["ranks"]) == MAX_RANKS
    assert len(document["ranks"]["0"]["scalars"]) == MAX_SCALARS


def test_a_window_tail_holds_the_newest_points_and_its_shape_names_the_series() -> None:
    document = history_document(view(history={"0": samples(3, loss=0.5)}), NOW)
    window = window_of(document)
    assert window.tail["tail"] is True
    assert window.tail["bins"] == TAIL_BINS
    assert window.tail["t0"] == NEWEST - (TAIL_BINS - 1) * BIN_S == window.tail_from
    assert window.tail["ranks"]["0"]["scalars"]["loss"] == [0.5] * TAIL_BINS
    assert window.newest == NEWEST
    same = window_of(history_document(view(history={"0": samples(2, loss=0.7)}), NOW + 5))
    assert same.shape == window.shape, "new points, the same series"
    more = {"0": samples(3, loss=0.5), "1": samples(3, loss=0.5)}
    assert window_of(history_document(view(history=more), NOW)).shape != window.shape
    other = {"0": samples(3, loss=0.5, lr=1e-4)}
    assert window_of(history_document(view(history=other), NOW)).shape != window.shape


class Source:
    """A TrainingComponent's answers, counted."""

    def __init__(self, answer: TrainingView, coordinator: bool = True) -> None:
        self.answer = answer
        self.coordinator = coordinator
        self.asked: list[tuple[str, bool]] = []

    def is_coordinator(self) -> bool:
        return self.coordinator

    async def view(self, history: bool = False) -> TrainingView:
        self.asked.append(("view", history))
        return self.answer

    async def coordinator_view(self, history: bool) -> TrainingView:
        self.asked.append(("coordinator_view", history))
        return self.answer


async def test_the_topics_read_the_group_and_gather_history_on_this_node() -> None:
    source = Source(view(history={"0": samples(2, start=NEWEST - 5, loss=0.5)}), coordinator=False)
    now = await training_topics(source)["training"]()
    assert [r["rank"] for r in now["ranks"]] == [0, 1]
    window_fn, interval_s = training_windows(source, clock=lambda: NOW)["training_history"]
    window = await window_fn()
    assert interval_s == BIN_S
    assert window.full["ranks"]["0"]["scalars"]["loss"][-2:] == [0.5, 0.5]
    assert source.asked == [("coordinator_view", False), ("view", True)], (
        "now as GET /v1/training answers; history gathered here, not carried twice"
    )
    assert await training_topics(None)["training"]() == {}
    empty = await training_windows(None, clock=lambda: NOW)["training_history"][0]()
    assert (empty.full["ranks"], empty.full["gpus"]) == ({}, {})


async def test_a_page_gets_the_window_whole_once_then_its_newest_points() -> None:
    clock = [NOW]
    source = Source(view(history={"0": samples(3, loss=0.5)}))
    window_fn, _ = training_windows(source, lambda: clock[0])["training_history"]
    hub = EventHub({}, lambda job: None, windows={"training_history": (window_fn, 0.0)})
    held, first = await hub.window_text("training_history", None)
    assert first is not None
    assert json.loads(first)["tail"] is False
    same, nothing = await hub.window_text("training_history", held)
    assert nothing is None, "nothing new: nothing sent"
    clock[0] += BIN_S
    source.answer = view(history={"0": samples(4, loss=0.5)})
    newer, tail = await hub.window_text("training_history", same)
    assert tail is not None
    update = json.loads(tail)
    assert (update["tail"], update["bins"]) == (True, TAIL_BINS)
    assert len(tail) < len(first) / 10
    clock[0] += BIN_S * (TAIL_BINS + 1)
    source.answer = view(history={"0": samples(4, loss=0.5)})
    _, again = await hub.window_text("training_history", newer)
    assert again is not None
    assert json.loads(again)["tail"] is False, "too far behind: whole"
    clock[0] += BIN_S
    source.answer = view(history={"0": samples(4, loss=0.5), "1": samples(1)})
    _, reshaped = await hub.window_text("training_history", newer)
    assert reshaped is not None
    assert json.loads(reshaped)["tail"] is False, "a new rank: whole"


async def test_a_window_is_recomputed_at_most_once_per_its_interval() -> None:
    computed = []

    async def window() -> Window:
        computed.append(1)
        return Window({"n": len(computed)}, {"n": len(computed)}, "s", 0.0, 0.0)

    hub = EventHub({}, lambda job: None, windows={"w": (window, 3600.0)})
    await asyncio.gather(*(hub.window_text("w", None) for _ in range(5)))
    assert computed == [1]
    assert "w" in hub.topics
