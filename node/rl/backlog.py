"""Backpressure of the rollouts store: at most `max_pending` unconsumed samples per run.

The trainer's RolloutStream tells each node's daemon how far it has consumed that node's store
(POST /v1/rollouts/consumed, a (created_at, sample_id) position; the routes are
node.rl.routes). A POST of rollouts that would leave more than `max_pending` samples of a run
after that position is refused whole, 429 with Retry-After; nothing is trimmed. The count is kept
incrementally (admitted rows in, consumed ranges out) and recounted from the store when it would
refuse and is older than `recount_s`; every race of the two errs on the side of counting more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from sync import (
    ROLLOUTS_SCHEMA,
    BacklogFullError,
    IngestResult,
    RecordStore,
    RecordValidationError,
)

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1.0
RECOUNT_S = 1.0
STAMP_STEP_S = 1e-6
Row = tuple[Any, ...]
Position = tuple[float, str]
"""(created_at, sample_id) of the last sample consumed."""


@dataclass
class RunBacklog:
    """One run's samples in this node's store after the consumed position."""

    consumed: Position | None = None
    pending: int = 0
    """Committed samples after `consumed`: exact at the last count, kept up since."""
    inflight: int = 0
    """Samples admitted whose request is not committed yet."""
    counted_at: float | None = None
    settled: int = 0
    """Samples ever added to `pending` by committed requests (to rebase a count on)."""
    refusing: bool = False


@dataclass(frozen=True)
class _Ticket:
    admitted: Mapping[str, int]
    uncounted: int
    """Rows of the request without a run (not capped)."""


class RolloutBacklog:
    """The rollouts store's IngestGate (sync.records.routes) and the consumed/pending routes.
    `store_of` answers the rollouts store (None while it is not open)."""

    def __init__(
        self,
        max_pending: int,
        store_of: Callable[[], RecordStore | None],
        *,
        retry_after_s: float = RETRY_AFTER_S,
        recount_s: float = RECOUNT_S,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"rollouts_max_pending {max_pending!r} must be at least 1")
        self.max_pending = max_pending
        self._store_of = store_of
        self.retry_after_s = retry_after_s
        self.recount_s = recount_s
        self._clock, self._wall = clock, wall
        self._stamp = 0.0
        self._runs: dict[str, RunBacklog] = {}
        self._pending_gauge = Gauge(
            "shoal_rollouts_pending",
            "Unconsumed rollouts of a run in this node's store (admitted, after the consumed "
            "position).",
            ["run"],
            registry=registry,
        )
        self._refused = Counter(
            "shoal_rollouts_refused_total",
            "Rollouts refused with 429 because the run had rollouts_max_pending unconsumed.",
            ["run"],
            registry=registry,
        )

    def state(self, run: str) -> RunBacklog:
        return self._runs.setdefault(run, RunBacklog())

    def runs(self) -> dict[str, RunBacklog]:
        """Every run this node knows of, by name (a copy of the mapping)."""
        return dict(self._runs)

    # --- the IngestGate -----------------------------------------------------------------------

    async def reserve(
        self, store: RecordStore, rows: Sequence[Row]
    ) -> tuple[object, Sequence[Row]]:
        """Admit the rows of one POST, or raise BacklogFullError (429) for the first run that
        would pass `max_pending`, RecordValidationError (400) when one request alone would.

        Admitted rows get this node's time of admission as created_at, strictly increasing
        from request to request: the order of created_at is the order of commits, so a reader
        that moves a (created_at, sample_id) cursor never skips a row committed late (the
        sample's own time stays in its payload's generated_at)."""
        if store.name != ROLLOUTS_SCHEMA.name:
            return None, rows
        columns = store.schema.columns
        run_at, time_at = columns.index("run"), columns.index(store.schema.time_column)
        admitted: dict[str, int] = {}
        for row in rows:
            if row[run_at] is not None:
                admitted[row[run_at]] = admitted.get(row[run_at], 0) + 1
        for run, count in admitted.items():
            if count > self.max_pending:
                raise RecordValidationError(
                    None,
                    "run",
                    f"{count} samples of run {run!r} in one request; the store keeps at most "
                    f"{self.max_pending} unconsumed (rollouts_max_pending): send fewer at a time",
                )
            state = self.state(run)
            stale = state.counted_at is None or self._clock() - state.counted_at >= self.recount_s
            if state.counted_at is None or (self._over(state, count) and stale):
                await self._recount(store, run)
        # no await from here on: check, reserve and stamp at once, in the order of enqueueing
        for run, count in admitted.items():
            state = self.state(run)
            if self._over(state, count):
                self._refuse(store, run, state, count)
        for run, count in admitted.items():
            state = self.state(run)
            state.inflight += count
            if state.refusing:
                state.refusing = False
                log.info("rollouts of run %s: admitted again", run)
        newest = store.status().newest_created_at
        stamp = max(self._wall(), self._stamp + STAMP_STEP_S, (newest or 0.0) + STAMP_STEP_S)
        self._stamp = stamp
        stamped = [(*row[:time_at], stamp, *row[time_at + 1 :]) for row in rows]
        return _Ticket(admitted, len(rows) - sum(admitted.values())), stamped

    def settle(self, store: RecordStore, ticket: object, result: IngestResult | None) -> None:
        """Move a request's rows from in flight to pending (all of them when it failed: none)."""
        if not isinstance(ticket, _Ticket):
            return
        exact = len(ticket.admitted) == 1 and ticket.uncounted == 0
        for run, count in ticket.admitted.items():
            state = self.state(run)
            state.inflight -= count
            if result is not None:
                # duplicates of a request of one run, all after `consumed`, are its own rows;
                # otherwise whose they are is unknown: count them all until the next recount
                added = max(0, count - result.duplicates) if exact else count
                state.pending += added
                state.settled += added
            self._pending_gauge.labels(run=run).set(state.pending + state.inflight)

    def _over(self, state: RunBacklog, count: int) -> bool:
        return state.pending + state.inflight + count > self.max_pending

    def _refuse(self, store: RecordStore, run: str, state: RunBacklog, count: int) -> None:
        self._refused.labels(run=run).inc(count)
        held = state.pending + state.inflight
        level = logging.DEBUG if state.refusing else logging.WARNING
        log.log(
            level,
            "rollouts of run %s: %s unconsumed, at most %s; producers get 429 until the trainer "
            "reads some",
            run,
            held,
            self.max_pending,
        )
        state.refusing = True
        raise BacklogFullError(store.name, run, held, self.max_pending, self.retry_after_s)

    async def _recount(self, store: RecordStore, run: str) -> None:
        """Count the run's samples after its consumed position in the store itself; requests
        settled meanwhile are added on top (they may be counted twice: never too few)."""
        state = self.state(run)
        consumed, settled = state.consumed, state.settled
        count = await store.count_range((("run", run),), after=consumed)
        state.pending = count + state.settled - settled
        state.counted_at = self._clock()
        self._pending_gauge.labels(run=run).set(state.pending + state.inflight)

    # --- consumption --------------------------------------------------------------------------

    async def consumed(self, run: str, position: Position) -> RunBacklog:
        """The trainer consumed `run` through `position`; an older position changes nothing."""
        state = self.state(run)
        before = state.consumed
        if before is not None and position <= before:
            return state
        state.consumed = position
        store = self._store_of()
        if store is not None and state.counted_at is not None:
            read = await store.count_range((("run", run),), after=before, through=position)
            state.pending = max(0, state.pending - read)
            self._pending_gauge.labels(run=run).set(state.pending + state.inflight)
        return state

    async def recount(self, run: str) -> RunBacklog | None:
        """The run's backlog counted from the store now; None while the store is not open."""
        store = self._store_of()
        if store is None:
            return None
        await self._recount(store, run)
        return self.state(run)

    # --- HTTP ---------------------------------------------------------------------------------
