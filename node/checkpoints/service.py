"""One node's part in checkpoints: it takes its training processes' written reports (checking
the files), sends its news to the coordinator until the step is committed, copies the files it
is asked to hold, deletes what retention says, and has a committed step's files here before
its ranks restore it (fetching the missing ones from their holders). The coordinator's side is
node.checkpoints.office; the routes are node.checkpoints.routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence

from health import LoopHealth
from net import PeerRequestError
from node.checkpoints.commit import RankReport
from node.checkpoints.fetch import Fetched, StepFiles
from node.checkpoints.office import CheckpointOffice
from node.checkpoints.retention import sweep
from node.checkpoints.wire import (
    NEWS_PATH,
    Accepted,
    HeldCopy,
    LogAnswer,
    NewsBody,
    ReportedFile,
    ReportedRank,
    RestoredBody,
    RestoreNews,
    RestorePlan,
    RestoreRecorded,
    WrittenBody,
)
from node.errors import AnsweredError, CheckpointsError
from node.locks.checkpoints import (
    CheckpointFile,
    CheckpointLog,
    CommittedStep,
    RestoreRecord,
    step_directory,
)
from node.locks.service import LockService
from node.runtime import NodeRuntime
from node.sync_service import SyncService
from sync import CHECKPOINTS, ManifestEntry, open_inside

log = logging.getLogger(__name__)

TICK_S = 0.5
"""How often the loop looks for news to send, copies to make and directories to delete."""
POLL_S = 2.0
"""With nothing to send, how often the node still asks the coordinator for the log."""
MAX_LOCAL_STEPS = 16
"""Uncommitted (generation, step) pairs whose local reports a node keeps sending."""


class CheckpointService:
    """See the module docstring. `open()` starts the loop; `close()` stops it."""

    def __init__(
        self,
        runtime: NodeRuntime,
        locks: LockService,
        sync: SyncService,
        office: CheckpointOffice,
        *,
        tick_s: float = TICK_S,
        poll_s: float = POLL_S,
    ) -> None:
        self.runtime = runtime
        self.node_id = runtime.node_id
        self.locks = locks
        self.office = office
        self.files = StepFiles(sync, runtime.breakers)
        self.keep = runtime.settings.checkpoint_keep
        self.tick_s = tick_s
        self.poll_s = poll_s
        self.log: CheckpointLog | None = None
        """The coordinator's log as last heard (None until heard since this daemon started)."""
        self.loop_health = LoopHealth("checkpoints")
        self._written: dict[tuple[int, int, int], RankReport] = {}
        self._held: set[tuple[int, int, str]] = set()
        self._restore: RestoreRecord | None = None
        self._restore_unsent = False
        self._preparing: dict[tuple[int, int], asyncio.Task[RestorePlan]] = {}
        self._prepared: dict[int, RestorePlan] = {}
        self._wake = asyncio.Event()
        self._exchanging = asyncio.Lock()
        self._heard_at = 0.0
        self._loop: asyncio.Task[None] | None = None
        self._copying: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await asyncio.to_thread(
            self.runtime.settings.checkpoint_dir.mkdir, parents=True, exist_ok=True
        )
        self._loop = asyncio.create_task(self._run(), name="checkpoints")

    async def close(self) -> None:
        """Stop the loop, a copy and a fetch in progress. Idempotent."""
        tasks = [t for t in (self._loop, self._copying, *self._preparing.values()) if t is not None]
        self._loop = self._copying = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # the training processes' reports

    async def written(self, body: WrittenBody) -> Accepted:
        """Take rank `body.rank`'s report of its files of a step (each checked on disk);
        CheckpointsError 409 naming what does not match."""
        directory = step_directory(body.step, body.generation)
        if body.directory != directory:
            raise CheckpointsError(
                409,
                "wrong_directory",
                f"step {body.step} of generation {body.generation} "
                f"is written into {directory}, not {body.directory}",
            )
        if body.rank >= body.world_size:
            raise CheckpointsError(409, "invalid_rank", f"rank {body.rank} of {body.world_size}")
        files = await self._checked(body, directory)
        report = RankReport(
            self.node_id, body.rank, body.step, body.generation, body.world_size, files
        )
        self._written[(body.generation, body.step, body.rank)] = report
        keys = sorted({(step, gen) for gen, step, _ in self._written})[-MAX_LOCAL_STEPS:]
        self._written = {k: r for k, r in self._written.items() if (k[1], k[0]) in keys}
        self._wake.set()
        newest = None if self.log is None else self.log.newest
        return Accepted(
            step=body.step, rank=body.rank, committed=None if newest is None else newest.step
        )

    async def _checked(self, body: WrittenBody, directory: str) -> tuple[CheckpointFile, ...]:
        """The report's files as committed records, each found on disk as reported; their
        manifest entries go to the sync catalog (no second hashing) when the piece sizes agree,
        else the catalog hashes them."""
        catalog = self.files.catalog()
        cache = catalog.cache(CHECKPOINTS)
        out: list[CheckpointFile] = []
        known: list[tuple[ManifestEntry, os.stat_result]] = []
        for item in body.files:
            path = f"{directory}/{item.name}"
            try:
                fd, info = await asyncio.to_thread(open_inside, catalog.root(CHECKPOINTS), path)
            except (OSError, ValueError) as exc:
                raise CheckpointsError(409, "file_missing", f"{path}: {exc}") from None
            try:
                if (info.st_size, info.st_mtime_ns) != (item.size, item.mtime_ns):
                    raise CheckpointsError(
                        409,
                        "file_changed",
                        f"{path}: {info.st_size} bytes at mtime_ns "
                        f"{info.st_mtime_ns} on disk, reported {item.size} at {item.mtime_ns}",
                    )
                entry = ManifestEntry(
                    path, item.size, item.mtime_ns, item.hash, tuple(item.pieces), body.piece_size
                )
                if body.piece_size == catalog.piece_size and _pieces_fit(entry):
                    known.append((entry, info))
                else:
                    hashed = await cache.entry_for_open_file(path, fd)
                    if hashed is None:
                        raise CheckpointsError(409, "file_changed", f"{path} changed while hashed")
                    entry = hashed
            finally:
                os.close(fd)
            out.append(CheckpointFile(path, entry.size, entry.hash))
        await cache.record_many(known)
        return tuple(out)

    # news to and from the coordinator

    async def exchange(self) -> CheckpointLog:
        """Send this node's news to the coordinator (or take it here when this node
        coordinates); the log it answers. AnsweredError when no coordinator takes it."""
        async with self._exchanging:
            news = self._news()
            body = news.model_dump(mode="json")
            answer = await self.locks.call_coordinator("POST", NEWS_PATH, body, forwarded=False)
            if answer is None:
                book = await self.office.receive(news)
            else:
                status, data = answer
                if status != 200:
                    reason = data.get("reason") if isinstance(data, dict) else data
                    raise CheckpointsError(
                        503, "coordinator_refused", f"the coordinator answered {status}: {reason}"
                    )
                book = LogAnswer.model_validate(data).log
            self._held -= {(h.step, h.generation, h.owner) for h in news.held}
            if news.restore is not None and self._restore is not None:
                self._restore_unsent = news.restore.at != self._restore.at
            newest = book.newest
            if newest is not None:
                self._written = {k: r for k, r in self._written.items() if r.step > newest.step}
            self.log, self._heard_at = book, time.monotonic()
            return book

    def _news(self) -> NewsBody:
        restore = self._restore if self._restore_unsent else None
        return NewsBody(
            node=self.node_id,
            written=[
                ReportedRank(
                    rank=r.rank,
                    step=r.step,
                    generation=r.generation,
                    world_size=r.world_size,
                    files=[ReportedFile(path=f.path, size=f.size, hash=f.hash) for f in r.files],
                )
                for _, r in sorted(self._written.items())
            ],
            held=[HeldCopy(step=s, generation=g, owner=o) for s, g, o in sorted(self._held)],
            restore=None
            if restore is None
            else RestoreNews(
                step=restore.step,
                source=restore.source,
                size_bytes=restore.size_bytes,
                fetched_bytes=restore.fetched_bytes,
                seconds=restore.seconds,
                at=restore.at,
            ),
        )

    def _has_news(self) -> bool:
        return bool(self._written or self._held or self._restore_unsent)

    # the loop: news, copies, retention

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_s):
                    await self._wake.wait()
            self._wake.clear()
            if self.runtime.coordinator is None:
                self.loop_health.record_success("no coordinator yet")
                continue
            idle_s = time.monotonic() - self._heard_at
            if not self._has_news() and idle_s < self.poll_s:
                continue
            await self._round()

    async def _round(self) -> None:
        try:
            book = await self.exchange()
            self._copy_newest(book)
            deleted = await asyncio.to_thread(sweep, self.files.root, book, self.keep)
        except (AnsweredError, PeerRequestError, OSError, ValueError) as exc:
            self.loop_health.record_failure(f"{type(exc).__name__}: {exc}")
            return
        newest = book.newest
        note = "nothing committed" if newest is None else f"step {newest.step} committed"
        self.loop_health.record_success(note + (f", {len(deleted)} deleted" if deleted else ""))

    def _copy_newest(self, book: CheckpointLog) -> None:
        """Start copying the newest step's files this node was asked to hold (one copy at a
        time; older steps are never copied: the newest is the one restored)."""
        if self._copying is not None and not self._copying.done():
            return
        newest = book.newest
        if newest is None:
            return
        owners = [
            owner
            for owner, nodes in sorted(newest.targets.items())
            if self.node_id in nodes
            and self.node_id not in newest.holders.get(owner, ())
            and (newest.step, newest.generation, owner) not in self._held
        ]
        if owners:
            self._copying = asyncio.create_task(self._copy(newest, owners), name="checkpoints-copy")

    async def _copy(self, record: CommittedStep, owners: Sequence[str]) -> None:
        for owner in owners:
            files = record.files.get(owner, ())
            try:
                missing = await self.files.missing(files)
                await self.files.fetch([(item, _sources(record, owner)) for item in missing])
            except CheckpointsError as exc:
                self.loop_health.record_failure(f"copy of {owner}'s step {record.step}: {exc}")
                continue
            log.info("checkpoints: holding %s's files of step %d", owner, record.step)
            self._held.add((record.step, record.generation, owner))
        self._wake.set()

    # restoring

    async def prepare(self, step: int, generation: int) -> RestorePlan:
        """Have every file of committed `step` here (fetched from its holders where missing);
        the local ranks of a node share one preparation. CheckpointsError 404 when the step is
        not committed, 503 when its files cannot be had."""
        key = (step, generation)
        task = self._preparing.get(key)
        if task is None:
            task = asyncio.create_task(self._prepare(step, generation), name=f"restore-{step}")
            self._preparing[key] = task
            task.add_done_callback(lambda _: self._preparing.pop(key, None))
        return await asyncio.shield(task)

    async def _prepare(self, step: int, generation: int) -> RestorePlan:
        try:
            return await self._have_step(step, generation)
        except CheckpointsError as exc:
            log.warning("checkpoints: cannot have step %d here for a restore: %s", step, exc)
            raise

    async def _have_step(self, step: int, generation: int) -> RestorePlan:
        started = time.monotonic()
        book = await self.exchange()
        record = book.find(step, generation)
        if record is None:
            newest = book.newest
            raise CheckpointsError(
                404,
                "not_committed",
                f"step {step} of generation {generation} is not a kept "
                f"committed step (newest: {None if newest is None else newest.step})",
            )
        owner_of = {item.path: owner for owner, item in record.all_files()}
        missing = await self.files.missing([item for _, item in record.all_files()])
        fetched = Fetched()
        if missing:
            wanted = [(item, _sources(record, owner_of[item.path])) for item in missing]
            fetched = await self.files.fetch(wanted)
        await asyncio.to_thread(self.files.restore_metadata, record.directory)
        for owner in record.files:  # every file is here now: this node holds a copy of each
            if owner != self.node_id and self.node_id not in record.holders.get(owner, ()):
                self._held.add((record.step, record.generation, owner))
        plan = RestorePlan(
            step=step,
            generation=generation,
            directory=str(self.files.root / record.directory),
            source="peers" if missing else "local",
            size_bytes=record.size_bytes,
            fetched_bytes=fetched.size_bytes,
            seconds=time.monotonic() - started,
        )
        log.info(
            "checkpoints: step %d here (%s, %d of %d bytes fetched in %.2f s)",
            step,
            plan.source,
            plan.fetched_bytes,
            plan.size_bytes,
            plan.seconds,
        )
        self._prepared = {step: plan}
        self._record_restore(plan, plan.seconds)
        return plan

    @property
    def last_restore(self) -> RestoreRecord | None:
        """This node's newest restore (the longest any of its ranks took), None before one."""
        return self._restore

    def restored(self, body: RestoredBody) -> RestoreRecorded:
        """A local rank loaded `body.step`: the node's last restore takes the longest time any
        of its ranks took. CheckpointsError 404 when this node did not prepare that step."""
        plan = self._prepared.get(body.step)
        if plan is None:
            raise CheckpointsError(
                404, "not_prepared", f"step {body.step} was not prepared on {self.node_id}"
            )
        current = self._restore
        seconds = max(body.seconds, plan.seconds)
        if current is not None and current.step == body.step:
            seconds = max(seconds, current.seconds)
        self._record_restore(plan, seconds)
        return RestoreRecorded(step=body.step, seconds=seconds)

    def _record_restore(self, plan: RestorePlan, seconds: float) -> None:
        self._restore = RestoreRecord(
            plan.step, plan.source, plan.size_bytes, plan.fetched_bytes, seconds, time.time()
        )
        self._restore_unsent = True
        self._wake.set()


def _sources(record: CommittedStep, owner: str) -> tuple[str, ...]:
    """The nodes to fetch `owner`'s files of `record` from: its holders, then the nodes asked
    to copy them (they may hold them already)."""
    holders = record.holders.get(owner, ())
    return (*holders, *(n for n in record.targets.get(owner, ()) if n not in holders))


def _pieces_fit(entry: ManifestEntry) -> bool:
    """The reported piece hashes fit the size: none for one piece, one per piece otherwise."""
    count = entry.piece_count
    return len(entry.pieces) == (0 if count == 1 else count)
