"""The training page's topics: the group now (`training`: every rank's step, rate, compute time,
scalars and straggler flag, the hang verdict, the restarts) and its last 15 minutes on one time
grid (`training_history`: steps/s, compute seconds and every scalar per rank, utilization and
memory per GPU of each training node), which a page gets whole once and then as its newest
points only."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from node.locks.table import Quarantine
from node.training.models import MAX_SCALARS, GpuHistory, RankHistory, TrainingView
from node.training.progress import HISTORY_S, SAMPLE_S
from node.ui.events import Window, WindowFn

BIN_S = SAMPLE_S
"""One point of the grid per sample of the daemons (they sample on this grid of the wall
clock)."""
BINS = int(HISTORY_S / BIN_S)
TAIL_BINS = 3
"""The newest points a page already holding the window is sent: two samples of slack."""
DIGITS = 4
"""Significant digits of a plotted value (a sparkline is a few dozen pixels high)."""
MAX_RANKS = 1024
MAX_GPUS_PER_NODE = 64
MAX_QUARANTINES = 256
"""Quarantine rows the page lists (the plan's first, then the table's re-admitted ones)."""


class TrainingSource(Protocol):
    """What the page reads of node.training's TrainingComponent."""

    def is_coordinator(self) -> bool: ...
    async def view(self, history: bool = False) -> TrainingView: ...
    async def coordinator_view(self, history: bool) -> TrainingView: ...


def _short(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{DIGITS}g}")


def quarantine_rows(
    quarantined: Mapping[str, str], records: Mapping[str, Quarantine]
) -> list[dict[str, Any]]:
    """The GPU quarantine as the page lists it: every node the plan quarantines (`reason` as
    the plan says it), then those re-admitted within the limit's window, from the lock table as
    this node last held it (`since`, `times` quarantined within the window, `held`: out until
    an undrain). `state`: quarantined (in the plan, or active in the table the plan follows),
    held or readmitted."""
    rows = []
    for node in sorted(set(quarantined) | set(records)):
        record = records.get(node)
        active = node in quarantined or (record is not None and record.active)
        held = bool(record is not None and record.held and active)
        rows.append(
            {
                "node": node,
                "state": "held" if held else "quarantined" if active else "readmitted",
                "reason": quarantined.get(node) or (record.reason if record else ""),
                "since": None if record is None else round(record.since, 1),
                "times": 0 if record is None else len(record.times),
                "held": held,
            }
        )
    rows.sort(key=lambda row: (row["state"] == "readmitted", row["node"]))
    return rows[:MAX_QUARANTINES]


def node_rows(view: TrainingView) -> list[dict[str, Any]]:
    """One row per training node: its ranks, its lowest and highest step, its summed rate,
    whether its part was read in time and its stragglers."""
    rows: dict[str, dict[str, Any]] = {
        node: {"node": node, "reachable": part.reachable} for node, part in view.nodes.items()
    }
    rows.update({node: {"node": node, "reachable": False} for node in view.missing})
    for rank in view.ranks:
        row = rows.setdefault(rank.node, {"node": rank.node, "reachable": True})
        row.setdefault("ranks", []).append(rank.rank)
        row["step_min"] = min(row.get("step_min", rank.step), rank.step)
        row["step_max"] = max(row.get("step_max", rank.step), rank.step)
        row["steps_per_s"] = row.get("steps_per_s", 0.0) + rank.steps_per_s
        if rank.straggler:
            row.setdefault("stragglers", []).append(rank.rank)
    for row in rows.values():
        if "steps_per_s" in row:
            row["steps_per_s"] = _short(row["steps_per_s"])
    return [rows[node] for node in sorted(rows)][:MAX_RANKS]


def now_document(
    view: TrainingView, quarantine: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The `training` topic: what the page shows beside each plot and marks on it, every
    node's summary, and the GPU quarantine."""
    return {
        "answered_by": view.answered_by,
        "coordinator": view.coordinator,
        "generation": view.generation,
        "world_size": view.world_size,
        "hung": view.hung,
        "hang_timeout_s": view.hang_timeout_s,
        "missing": view.missing,
        "ranks": [
            {
                "rank": rank.rank,
                "node": rank.node,
                "local_rank": rank.local_rank,
                "gpu": rank.gpu,
                "step": rank.step,
                "steps_per_s": _short(rank.steps_per_s),
                "compute_s": _short(rank.compute_s),
                "scalars": {name: _short(value) for name, value in sorted(rank.scalars.items())},
                "straggler": rank.straggler,
                "last_advance_age_s": round(rank.last_advance_age_s),
            }
            for rank in view.ranks[:MAX_RANKS]
        ],
        "restarts": [restart.to_json() for restart in view.restarts],
        "stragglers": [event.to_json() for event in view.stragglers],
        "nodes": node_rows(view),
        "quarantine": quarantine or [],
    }


class Grid:
    """BINS points of BIN_S seconds ending with the one `now` falls in."""

    def __init__(self, now: float, bins: int = BINS, bin_s: float = BIN_S) -> None:
        self.bins, self.bin_s = bins, bin_s
        self.newest = math.floor(now / bin_s) * bin_s
        self.t0 = self.newest - (bins - 1) * bin_s

    def place(self, at: Sequence[float], values: Sequence[float | None]) -> list[float | None]:
        """`values` sampled at `at` on the grid (the last sample of a point wins; None: none)."""
        found: list[float | None] = [None] * self.bins
        for when, value in zip(at, values, strict=False):
            index = math.floor((when - self.t0) / self.bin_s)
            if 0 <= index < self.bins and value is not None:
                found[index] = _short(value)
        return found


def _rank_series(grid: Grid, history: RankHistory) -> dict[str, Any]:
    scalars = sorted(history.scalars.items())[:MAX_SCALARS]
    return {
        "steps_per_s": grid.place(history.at, history.steps_per_s),
        "compute_s": grid.place(history.at, history.compute_s),
        "scalars": {name: grid.place(history.at, values) for name, values in scalars},
    }


def _gpu_series(grid: Grid, gpu: GpuHistory) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "memory_total_mb": gpu.memory_total_mb,
        "util_pct": grid.place(gpu.at, gpu.util_pct),
        "memory_used_mb": grid.place(gpu.at, gpu.memory_used_mb),
    }


def history_document(view: TrainingView, now: float) -> dict[str, Any]:
    """The whole window of the `training_history` topic: per rank (by rank) its steps/s,
    compute seconds and scalars, per training node (by node) its GPUs' utilization and memory
    used, each a list of BINS points from `t0` (unix s), BIN_S apart."""
    grid = Grid(now)
    histories = sorted((view.history or {}).items(), key=lambda item: int(item[0]))[:MAX_RANKS]
    return {
        "tail": False,
        "t0": grid.t0,
        "bin_s": grid.bin_s,
        "bins": grid.bins,
        "ranks": {rank: _rank_series(grid, history) for rank, history in histories},
        "gpus": {
            node: [_gpu_series(grid, gpu) for gpu in gpus[:MAX_GPUS_PER_NODE]]
            for node, gpus in sorted((view.gpu_history or {}).items())
        },
    }


def _cut(value: Any, keep: int) -> Any:
    """Every list in `value` (a document's series) cut to its last `keep` points."""
    if isinstance(value, list) and all(not isinstance(item, dict) for item in value):
        return value[-keep:]
    if isinstance(value, list):
        return [_cut(item, keep) for item in value]
    if isinstance(value, dict):
        return {key: _cut(item, keep) for key, item in value.items()}
    return value


def _shape(value: Any) -> Iterable[str]:
    """The names of every series of a document (what a page must hold to merge a tail)."""
    if isinstance(value, dict):
        for key, item in sorted(value.items()):
            if isinstance(item, list | dict):
                yield from (f"{key}/{name}" for name in _shape(item))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, dict):
                yield from (f"{index}/{name}" for name in _shape(item))
        if all(not isinstance(item, dict) for item in value):
            yield "."


def window_of(full: dict[str, Any], tail_bins: int = TAIL_BINS) -> Window:
    """The full document, its newest `tail_bins` points (`tail`: true, `t0` moved), and its
    shape (the series it holds, the grid's size)."""
    keep = min(tail_bins, int(full["bins"]))
    series = {"ranks": full["ranks"], "gpus": full["gpus"]}
    tail = {
        **full,
        **_cut(series, keep),
        "tail": True,
        "t0": full["t0"] + (full["bins"] - keep) * full["bin_s"],
        "bins": keep,
    }
    names = json.dumps([full["bins"], full["bin_s"], *_shape(series)])
    shape = hashlib.sha256(names.encode()).hexdigest()[:16]
    newest = full["t0"] + (full["bins"] - 1) * full["bin_s"]
    return Window(full=full, tail=tail, shape=shape, tail_from=tail["t0"], newest=newest)


async def group_view(source: TrainingSource, history: bool) -> TrainingView:
    """The group's document as GET /v1/training answers it on this node."""
    if source.is_coordinator():
        return await source.view(history)
    return await source.coordinator_view(history)


def training_topics(
    source: TrainingSource | None, quarantine: Callable[[], list[dict[str, Any]]] = list
) -> dict[str, Callable[[], Any]]:
    """The `training` topic over `source` (None: a daemon without training: an empty
    document), with the GPU quarantine's rows (`quarantine()`, quarantine_rows)."""

    async def training() -> dict[str, Any]:
        if source is None:
            return {}
        return now_document(await group_view(source, False), quarantine())

    return {"training": training}


def training_windows(
    source: TrainingSource | None, clock: Callable[[], float] = time.time
) -> Mapping[str, tuple[WindowFn, float]]:
    """The `training_history` window over `source`, recomputed at most once per BIN_S. This
    node gathers the histories itself (each training node answers its own part, within the
    part timeout) rather than through the coordinator, which would carry them twice."""

    async def history() -> Window:
        empty = TrainingView(
            answered_by="",
            coordinator=None,
            generation=None,
            world_size=0,
            hung=False,
            hang_timeout_s=0.0,
            ranks=[],
            restarts=[],
        )
        view = empty if source is None else await source.view(True)
        return window_of(history_document(view, clock()))

    return {"training_history": (history, BIN_S)}
