"""The reports of this node's training ranks, kept in memory for the current generation: each
rank's step, when it last advanced, its rate, its recent compute times and scalars, and the last
15 minutes of samples (what the dashboard plots)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from node.training.models import RankHistory, RankProgress, ReportsBody

RATE_WINDOW_S = 30.0
"""Steps per second are counted over the reports of the last this many seconds."""
HISTORY_S = 15 * 60.0
SAMPLE_S = 5.0
"""A history sample of every rank this often: 180 samples cover HISTORY_S."""
MAX_RATE_SAMPLES = 256


@dataclass
class _Sample:
    at: float
    steps_per_s: float
    compute_s: float | None
    scalars: dict[str, float]


@dataclass
class _Rank:
    """What this node knows of one rank (times are the daemon's monotonic clock)."""

    rank: int
    local_rank: int
    generation: int
    pid: int
    window: int
    step: int = -1
    last_report_at: float = 0.0
    last_advance_at: float = 0.0
    rate: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=MAX_RATE_SAMPLES))
    compute: deque[float] = field(default_factory=deque)
    scalars: dict[str, float] = field(default_factory=dict)
    dropped: int = 0
    history: deque[_Sample] = field(default_factory=deque)
    next_sample_at: float = 0.0

    def steps_per_s(self, now: float) -> float:
        recent = [(t, step) for t, step in self.rate if t >= now - RATE_WINDOW_S]
        if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
            return 0.0
        return (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])


class ProgressStore:
    """The reports of this node's ranks. `accept` takes a batch; `set_generation` drops the
    ranks of older generations; `ranks()` and `history()` answer. `window` is how many compute
    times are kept per rank (straggler_window). Not thread-safe (the event loop's)."""

    def __init__(
        self,
        node_id: str,
        window: int,
        *,
        gpu_of: Callable[[int], str | None] = lambda local_rank: None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.window = window
        self._gpu_of = gpu_of
        self._clock = clock
        self._wall_clock = wall_clock
        self._ranks: dict[int, _Rank] = {}
        self.generation: int | None = None
        self._generation_since = clock()
        self.reporting = False
        """Some rank reported since this store was made."""

    def set_generation(self, generation: int | None) -> None:
        """The node's plan runs `generation`: forget every rank of an older one."""
        if generation != self.generation:
            self._generation_since = self._clock()
        self.generation = generation
        if generation is not None:
            self._ranks = {r: s for r, s in self._ranks.items() if s.generation >= generation}

    def accept(self, body: ReportsBody) -> int:
        """Keep a batch of reports; 0 when its generation is older than the node's (or than the
        rank's newest reports). Report times are moved onto this daemon's clock."""
        if self.generation is not None and body.generation < self.generation:
            return 0
        known = self._ranks.get(body.rank)
        if known is not None and known.generation > body.generation:
            return 0
        if known is None or known.generation < body.generation or known.pid != body.pid:
            known = self._ranks[body.rank] = _Rank(
                body.rank, body.local_rank, body.generation, body.pid, self.window
            )
        now, wall = self._clock(), self._wall_clock()
        known.dropped += body.dropped
        for report in body.reports:
            at = min(now, now - (wall - report.at))
            known.last_report_at = max(known.last_report_at, at)
            if report.step > known.step:
                known.step, known.last_advance_at = report.step, at
                known.rate.append((at, report.step))
            if report.compute_s is not None:
                known.compute.append(report.compute_s)
                while len(known.compute) > self.window:
                    known.compute.popleft()
            known.scalars.update(report.scalars)
        if body.reports:
            self.reporting = True
            self._sample(known, now)
        return len(body.reports)

    def generation_age_s(self) -> float:
        """Seconds since the node's plan moved to its current generation."""
        return round(self._clock() - self._generation_since, 3)

    def ranks(self) -> list[RankProgress]:
        """Every rank of the current generation, by rank."""
        now = self._clock()
        return [self._progress(self._ranks[rank], now) for rank in sorted(self._ranks)]

    def history(self) -> dict[str, RankHistory]:
        """Each rank's samples of the last HISTORY_S, by rank (as a string: a JSON key)."""
        found: dict[str, RankHistory] = {}
        for rank, known in sorted(self._ranks.items()):
            samples = list(known.history)
            names = sorted({name for sample in samples for name in sample.scalars})
            found[str(rank)] = RankHistory(
                at=[round(s.at, 3) for s in samples],
                steps_per_s=[round(s.steps_per_s, 4) for s in samples],
                compute_s=[s.compute_s for s in samples],
                scalars={name: [s.scalars.get(name) for s in samples] for name in names},
            )
        return found

    def _sample(self, known: _Rank, now: float) -> None:
        if now < known.next_sample_at:
            return
        known.next_sample_at = now + SAMPLE_S
        compute = known.compute[-1] if known.compute else None
        wall = self._wall_clock()
        known.history.append(_Sample(wall, known.steps_per_s(now), compute, dict(known.scalars)))
        while known.history and known.history[0].at < wall - HISTORY_S:
            known.history.popleft()

    def _progress(self, known: _Rank, now: float) -> RankProgress:
        compute = list(known.compute)
        return RankProgress(
            rank=known.rank,
            node=self.node_id,
            local_rank=known.local_rank,
            generation=known.generation,
            step=known.step,
            steps_per_s=round(known.steps_per_s(now), 4),
            last_report_age_s=round(now - known.last_report_at, 3),
            last_advance_age_s=round(now - known.last_advance_at, 3),
            compute_s=statistics.median(compute) if compute else None,
            compute_min_s=min(compute) if compute else None,
            compute_samples=len(compute),
            gpu=self._gpu_of(known.local_rank),
            pid=known.pid,
            scalars=dict(known.scalars),
            dropped=known.dropped,
        )


def summary(ranks: list[RankProgress]) -> Mapping[str, object] | None:
    """The status document's `training`: the node's ranks, its highest step and median rate
    (what cluster_monitor shows per node); None when it has no rank reporting."""
    if not ranks:
        return None
    return {
        "generation": max(rank.generation for rank in ranks),
        "ranks": len(ranks),
        "step": max(rank.step for rank in ranks),
        "steps_per_s": round(statistics.median(rank.steps_per_s for rank in ranks), 3),
    }
