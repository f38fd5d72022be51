"""The coordinator's side of checkpoints: the ranks' written reports wait in memory (every node
sends its own again until the step is committed, so a new coordinator hears them too); once
every rank of a generation reported a step, the step is committed in the lock table's
checkpoint log, kept on a majority of the voters, with the nodes asked to copy each node's
files. Copies confirmed, copies repaired when holders die, and each node's last restore go to
the same log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from node.checkpoints.commit import (
    RankReport,
    add_reports,
    committed_record,
    decide_commit,
    prune_pending,
    with_commit,
    with_held,
    with_restore,
    with_targets,
)
from node.checkpoints.replicas import Domain, plan_replicas, repairs
from node.checkpoints.wire import NewsBody
from node.locks.checkpoints import CheckpointFile, CheckpointLog, RestoreRecord
from node.locks.service import LockService
from node.locks.table import LockTable, put_checkpoints

log = logging.getLogger(__name__)


def reports_of(news: NewsBody) -> list[RankReport]:
    """The rank reports a node's news carries, as the commit decision reads them."""
    return [
        RankReport(
            node=news.node,
            rank=item.rank,
            step=item.step,
            generation=item.generation,
            world_size=item.world_size,
            files=tuple(CheckpointFile(f.path, f.size, f.hash) for f in item.files),
        )
        for item in news.written
    ]


def restore_of(news: NewsBody) -> RestoreRecord | None:
    item = news.restore
    if item is None:
        return None
    return RestoreRecord(
        item.step, item.source, item.size_bytes, item.fetched_bytes, item.seconds, item.at
    )


class CheckpointOffice:
    """What the coordinator does with the nodes' news (see the module docstring)."""

    def __init__(
        self,
        locks: LockService,
        *,
        replicas: int,
        keep: int,
        domains: Mapping[str, Domain],
        alive: Callable[[], Sequence[str]],
        copy_after_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.locks = locks
        self.replicas = replicas
        self.keep = keep
        self.domains = dict(domains)
        self._alive = alive
        self.copy_after_s = copy_after_s
        self._alive_since: dict[str, float] = {}
        self._clock = clock
        self._pending: dict[tuple[int, int], dict[int, RankReport]] = {}
        self._first_seen: dict[tuple[int, int], dict[int, float]] = {}
        """(generation, step) -> rank -> when its report first came (commit latency)."""
        self.commit_latencies_s: list[float] = []
        """Per commit: seconds from the last rank's first report to the commit on a majority."""

    async def receive(self, news: NewsBody) -> CheckpointLog:
        """Take `news` (on the coordinator): commit what it completes, record copies and the
        restore, ask for copies where holders died; the log as stored on a majority.
        LockError 503 when no majority stores it (the sender sends again)."""
        reports = reports_of(news)
        self._pending = add_reports(self._pending, reports)
        now = self._clock()
        for report in reports:
            self._first_seen.setdefault(report.key, {}).setdefault(report.rank, now)
        pending, alive = self._pending, list(self._alive())
        settled = self._settled(alive, now)
        restore = restore_of(news)
        committed: list[tuple[int, int]] = []

        def change(table: LockTable, term: int, at: float) -> tuple[LockTable, None]:
            book = table.checkpoints
            for held in news.held:
                book = with_held(book, news.node, held.step, held.generation, held.owner)
            if restore is not None:
                book = with_restore(book, news.node, restore)
            newest = book.newest
            decided = decide_commit(pending, None if newest is None else newest.step)
            if decided is not None:
                ranks = pending[decided]
                owners = sorted({report.node for report in ranks.values()})
                targets = plan_replicas(
                    owners,
                    settled,
                    self.replicas,
                    self.domains,
                    holders={owner: (owner,) for owner in owners},
                    alive=alive,
                )
                book = with_commit(book, committed_record(ranks, at, targets), self.keep)
                committed.append(decided)
            elif newest is not None:
                added = repairs(newest, alive, self.replicas, self.domains, settled)
                book = with_targets(book, added)
            return put_checkpoints(table, term, book), None

        await self.locks.apply(change)
        book = self.locks.table.checkpoints
        for generation, step in committed:
            waited = self._clock() - max(
                self._first_seen.get((generation, step), {0: now}).values()
            )
            self.commit_latencies_s = [*self.commit_latencies_s[-99:], waited]
            log.info(
                "checkpoints: committed step %d of generation %d (%.3f s after its last report)",
                step,
                generation,
                waited,
            )
        newest = book.newest
        self._pending = prune_pending(self._pending, None if newest is None else newest.step)
        self._first_seen = {
            key: seen for key, seen in self._first_seen.items() if key in self._pending
        }
        return book

    def _settled(self, alive: Sequence[str], now: float) -> list[str]:
        """The alive nodes alive (in this coordinator's view) for `copy_after_s`: the ones
        asked for copies. A node that just joined is not: its ranks are about to restore and
        fetch what they need themselves, and a node that flaps is not loaded with copies."""
        self._alive_since = {node: self._alive_since.get(node, now) for node in alive}
        return [n for n, since in self._alive_since.items() if now - since >= self.copy_after_s]

    @property
    def pending(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """(generation, step) -> the ranks that reported it, of the steps not committed yet."""
        return {key: tuple(sorted(ranks)) for key, ranks in sorted(self._pending.items())}

    async def current(self) -> CheckpointLog:
        """The log of the table this coordinator serves (read from a majority first in a new
        term)."""
        await self.locks.current()
        return self.locks.table.checkpoints
