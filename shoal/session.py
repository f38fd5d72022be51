"""`shoal.training_session()`: what a training script holds for its whole life. It joins this
generation's group (torchrun's environment, else the local daemon's rendezvous), reports
progress without blocking the loop, and saves and restores checkpoints through
`shoal.checkpoint`.

    with shoal.training_session() as session:
        step = session.restore(state) or 0
        while training:
            try:
                ...                                   # the step, its collectives
            except shoal.GroupChanged:                # only with training_reform: in_place
                step = session.reform(state, step)    # re-form in place, state from a live peer
                continue
            step += 1
            session.report(step, loss=loss.item())
            if step % 100 == 0:
                session.save(state, step)

With the node's `training_reform: in_place` (SHOAL_REFORM=in_place in the worker's environment)
a change of the group does not end this process: its collectives give way (shoal.guard), and
`reform` joins the next generation, where the ranks that hold the newest step in memory send it
to those that lack it (shoal.live) and only a group with no live state reads a checkpoint.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from shoal._daemon import DaemonClient
from shoal.compute import CollectiveClock
from shoal.errors import GroupError, SessionError, ShoalError
from shoal.group import TrainingGroup, torch_modules
from shoal.guard import CollectiveGuard, GroupChanged
from shoal.joining import (
    ENV_AFTER_GENERATION,
    ENV_REFORM,
    WATCH_S,
    Reform,
    seconds_from,
    wait_for_rank,
    with_node,
)
from shoal.live import TrainingState
from shoal.place import RankPlace
from shoal.rendezvous import Rendezvous, fetch_rendezvous, rendezvous_from_env
from shoal.report import Reporter

__all__ = ["TrainingSession", "training_session"]

log = logging.getLogger(__name__)

DEFAULT_COLLECTIVE_S = 10.0
"""config.Timeouts.collective_s's default (a contract test keeps them equal); the launcher
passes its node's value as SHOAL_COLLECTIVE_S."""
DEFAULT_QUORUM_S = 60.0
"""config.Timeouts.quorum_s's default: how long joining a group may take (SHOAL_QUORUM_S)."""


class TrainingSession:
    """One training process's membership in its group: where it stands (`rank`, `local_rank`,
    `world_size`, `generation`), its `group` (a TrainingGroup), its progress reports and
    checkpoints. Made by `training_session()`; a context manager whose exit closes it."""

    def __init__(
        self,
        rendezvous: Rendezvous,
        client: DaemonClient | None,
        *,
        collective_s: float = DEFAULT_COLLECTIVE_S,
        join_s: float = DEFAULT_QUORUM_S,
        report_interval_s: float = 0.5,
        measure_compute: bool = True,
        in_place: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if in_place and client is None:
            raise ShoalError(
                f"{ENV_REFORM}=in_place needs the local daemon (SHOAL_DAEMON_URL is unset)"
            )
        self.group = TrainingGroup(collective_timeout_s=collective_s, join_timeout_s=join_s)
        self._client = client
        self._place = rendezvous.place
        self._master_addr = rendezvous.master_addr
        self._checkpointer: Any = None
        self._superseded = threading.Event()
        self._seen = rendezvous.generation
        """The newest generation the daemon named (reports' answers, the watcher)."""
        self.in_place = in_place
        """The group re-forms in place (`reform`) rather than in new processes."""
        self.last_reform: Reform | None = None
        """How the last `reform` (or in-place `restore`) brought this rank's state."""
        self._clock: CollectiveClock | None = None
        self._closed = False
        self._watcher: threading.Thread | None = None
        _, dist = torch_modules()
        if dist.is_initialized():
            self.group.adopt(rendezvous)
        elif in_place:
            self._watcher = threading.Thread(
                target=self._watch, name=f"shoal-watch-rank{self.rank}", daemon=True
            )
            self._watcher.start()
            rendezvous = self._form(rendezvous, time.monotonic() + join_s)
            self._place = with_node(rendezvous.place, self._place.node_id)
            self._master_addr = rendezvous.master_addr
        else:
            self.group.configure(rendezvous)
        self._now = clock
        if measure_compute:
            self._clock = CollectiveClock(clock)
            self._clock.install(dist)
        self._last_report_at: float | None = None
        self._reporter = Reporter(
            client,
            self._place,
            interval_s=report_interval_s,
            on_failure=self.group.report_error,
            on_generation=self._daemon_generation,
        )
        self._guard: CollectiveGuard | None = None
        if in_place:
            self._guard = CollectiveGuard(collective_s, self._give_way)
            self._guard.install(dist)

    @property
    def place(self) -> RankPlace:
        return self._place

    @property
    def rank(self) -> int:
        return self._place.rank

    @property
    def local_rank(self) -> int:
        return self._place.local_rank

    @property
    def world_size(self) -> int:
        return self._place.world_size

    @property
    def generation(self) -> int:
        return self._place.generation

    @property
    def reports_dropped(self) -> int:
        """Reports dropped so far (no daemon, or more waiting than the buffer holds)."""
        return self._reporter.dropped

    def superseded(self) -> bool:
        """True once the daemon runs a newer generation than this one: this process's group is
        over (the daemon stops it; a script may also leave on its own)."""
        return self._superseded.is_set()

    def report(self, step: int, compute_s: float | None = None, **scalars: float) -> None:
        """Record that this rank finished `step`, with its own compute time (measured by the
        session when not given: the time since the last report less the time blocked in
        collectives) and `scalars` such as loss. Never blocks and never raises for an
        unreachable daemon; raises SessionError for a background failure recorded since the
        last call (a refused report, a failed asynchronous save)."""
        if self._checkpointer is not None or self.group.errored() is not None:
            self._raise_recorded()
        if compute_s is None and self._clock is not None:
            now = self._now()
            last, self._last_report_at = self._last_report_at, now
            if last is not None:
                compute_s = max(0.0, now - last - self._clock.take())
            else:
                self._clock.take()
        self._reporter.add(step, compute_s, scalars)

    def save(self, state: Mapping[str, Any], step: int, *, blocking: bool = False) -> None:
        """Save `state` as `step` (shoal.checkpoint.Checkpointer.save); raises SessionError for
        a background failure recorded since the last call first."""
        self._raise_recorded()
        self._checkpoints().save(state, step, blocking=blocking)

    def restore(self, state: TrainingState) -> int | None:
        """Load the newest committed step into `state`: its step, or None when there is none.
        In place (`in_place`), a process joining a group whose other ranks hold newer state in
        memory takes theirs instead (as `reform` does, holding nothing itself)."""
        self._raise_recorded()
        if self.in_place:
            return self._bring_state(state, None)
        step: int | None = self._checkpoints().restore(state)
        return step

    def reform(self, state: TrainingState, step: int | None) -> int | None:
        """After GroupChanged: leave this generation's group, join the next one the daemon
        gives this rank, and bring `state` to the newest step any rank holds in memory (`step`
        is the last step this rank's `state` completed; None: nothing trustworthy). Returns the
        step to go on from: the newest live step, else the newest committed one (None: none).
        Every rank of the new group calls `reform` or, in a new process, `restore`. Raises
        GroupError when no newer group forms within the join timeout (the process should
        exit; its launcher starts it again)."""
        if not self.in_place:
            raise SessionError(
                f"reform needs {ENV_REFORM}=in_place (the node's training_reform: in_place)"
            )
        self._raise_recorded()
        self._join_next()
        return self._bring_state(state, step)

    def _join_next(self) -> None:
        """Leave this generation's group and form the next one the daemon gives this rank."""
        if not self._superseded.is_set():
            # the group broke here first (a peer's process or host died): the daemon may not
            # know yet, when nothing of that peer's node is left to tell it
            change = self._guard.last_change if self._guard is not None else None
            self._reporter.broken(change.reason if change is not None else "reform asked")
        deadline = time.monotonic() + self.group.join_timeout_s
        leaving = self._place.generation
        self._drop_checkpointer()
        client = self._client
        assert client is not None  # in_place needs one
        left_s = max(0.1, deadline - time.monotonic())
        rendezvous = wait_for_rank(client, self._place.local_rank, left_s, leaving)
        self._moved_to(self._form(rendezvous, deadline))

    def _form(self, rendezvous: Rendezvous, deadline: float) -> Rendezvous:
        """Form `rendezvous`'s group in place: every rank meets at a barrier (each rank of an
        in-place group, a new process too) that waits for all of them, however late a process
        starts, until `deadline`, and gives way at once to a newer generation, which is formed
        next. The rendezvous formed; GroupError at the deadline."""
        client = self._client
        assert client is not None  # in_place needs one
        while True:
            forming = rendezvous.generation
            self._seen = max(self._seen, forming)
            try:
                self.group.configure(
                    rendezvous,
                    join_s=max(0.1, deadline - time.monotonic()),
                    give_way=self._newer_than(forming),
                )
                return rendezvous
            except GroupError as exc:
                if time.monotonic() >= deadline:
                    raise
                log.warning("shoal: %s; joining the newest generation", exc)
            left_s = max(0.1, deadline - time.monotonic())
            rendezvous = wait_for_rank(client, self._place.local_rank, left_s, forming)

    def watch_ddp(self, model: Any) -> None:
        """Measure a DistributedDataParallel model's exposed gradient all-reduce too (its
        default all-reduce, through a communication hook)."""
        if self._clock is not None:
            model.register_comm_hook(None, self._clock.ddp_hook())

    def close(self) -> None:
        """Send what is left, wait for an in-flight save, leave the group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._reporter.close()
            if self._checkpointer is not None:
                self._checkpointer.close()
        finally:
            if self._clock is not None:
                self._clock.uninstall()
            if self._guard is not None:
                self._guard.uninstall()
            self.group.close()
            if self._client is not None:
                self._client.close()

    def __enter__(self) -> TrainingSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _newer_than(self, generation: int) -> Callable[[], str | None]:
        """What a group of `generation` forming gives way to: a newer generation the daemon
        named (the reports' answers and the watcher keep `_seen`)."""

        def newer() -> str | None:
            seen = self._seen
            return f"generation {seen} is ready" if seen > generation else None

        return newer

    def _moved_to(self, rendezvous: Rendezvous) -> None:
        """This session now stands in `rendezvous`'s group: its place, its reports."""
        place = with_node(rendezvous.place, self._place.node_id)
        self._place = place
        self._master_addr = rendezvous.master_addr
        self._reporter.move(place)
        self._superseded.clear()
        if self._seen > place.generation:
            self._superseded.set()  # a newer one came while this one formed

    def _bring_state(self, state: TrainingState, step: int | None) -> int | None:
        """Every rank of the (new) group: agree on the newest live step; its lowest holder sends
        its state to the ranks lacking it; with no live state anywhere, restore the newest
        committed checkpoint. The step to go on from."""
        from shoal import live  # torch is loaded by now

        while True:
            started = time.monotonic()
            try:
                holding = live.agree(step)
                if holding.newest is None:
                    restored: int | None = self._checkpoints().restore(state)
                    self.last_reform = Reform(
                        self.generation, restored, "checkpoint", None, 0, time.monotonic() - started
                    )
                    return restored
                transfer = live.share_state(state, holding, self.rank)
                break
            except GroupChanged as exc:
                # the group changed again while it agreed: the next one, with what we held
                log.warning("shoal: %s; re-forming again", exc)
                self._join_next()
        received = transfer is not None and self.rank in transfer.receivers
        self.last_reform = Reform(
            self.generation,
            holding.newest,
            "peer" if received else "memory",
            holding.source,
            transfer.size_bytes if transfer is not None else 0,
            time.monotonic() - started,
        )
        if received:
            log.info(
                "shoal: rank %s took step %s from rank %s (%d bytes)",
                self.rank,
                holding.newest,
                holding.source,
                transfer.size_bytes if transfer is not None else 0,
            )
        return holding.newest

    def _drop_checkpointer(self) -> None:
        """Leave the old generation's checkpointer without waiting on it: a save in flight
        there may wait on a dead peer. Its step, written by a generation that did not finish
        it, is never committed; the next save makes a checkpointer for the new group."""
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            checkpointer.abandon()

    def _give_way(self) -> str | None:
        """The guard's question before and during each collective: a newer generation?"""
        if self._superseded.is_set():
            return f"generation {self._place.generation} is superseded"
        return None

    def _watch(self) -> None:
        """Ask the daemon every WATCH_S for this rank's rendezvous: a newer generation means
        this group is over (a collective blocked on a stopped or cut-off peer gives way)."""
        client = self._client
        assert client is not None
        while not self._closed:
            time.sleep(WATCH_S)
            try:
                found = fetch_rendezvous(client, self._place.local_rank, 2.0)
            except ShoalError:
                continue  # the daemon is away for a moment; the collective timeout still holds
            if found is not None:
                self._daemon_generation(found.generation)

    def _raise_recorded(self) -> None:
        failure = self.group.take_error()
        if failure is None and self._checkpointer is not None:
            failure = self._checkpointer.failure()
        if failure is None:
            return
        if isinstance(failure, SessionError):
            raise failure
        raise SessionError(f"a background task of the session failed: {failure}") from failure

    def _checkpoints(self) -> Any:
        if self._checkpointer is None:
            try:
                module = importlib.import_module("shoal.checkpoint")
            except ImportError as exc:
                raise ShoalError(f"checkpoints need shoal.checkpoint: {exc}") from exc
            self._checkpointer = module.Checkpointer(
                self._place, self._client, master_addr=self._master_addr
            )
        return self._checkpointer

    def _daemon_generation(self, generation: int) -> None:
        """The daemon's current generation (after each post): a newer one supersedes ours, and
        with NCCL the communicator is aborted so a collective blocked on the old group ends."""
        self._seen = max(self._seen, generation)
        if generation <= self._place.generation or self._superseded.is_set():
            return
        self._superseded.set()
        log.warning("shoal: generation %s is superseded by %s", self._place.generation, generation)
        self.group.abort()


def training_session(
    *,
    env: Mapping[str, str] | None = None,
    join_timeout_s: float | None = None,
    report_interval_s: float = 0.5,
    measure_compute: bool = True,
) -> TrainingSession:
    """Join this generation's training group and return its session (see TrainingSession).

    The rendezvous comes from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...: what
    torchrun and the shoal launcher set), else from the local daemon (GET /v1/rendezvous for
    LOCAL_RANK, waiting up to `join_timeout_s`, default SHOAL_QUORUM_S or 60 s). Reports go to
    the daemon SHOAL_DAEMON_URL names; without one (plain torchrun) they are dropped after one
    warning. GroupError when no group forms in time.
    """
    env = os.environ if env is None else env
    join_s = join_timeout_s or seconds_from(env, "SHOAL_QUORUM_S", DEFAULT_QUORUM_S)
    collective_s = seconds_from(env, "SHOAL_COLLECTIVE_S", DEFAULT_COLLECTIVE_S)
    reform = env.get(ENV_REFORM, "")
    if reform not in ("", "restart", "in_place"):
        raise ShoalError(f"{ENV_REFORM}={reform!r} must be in_place or restart")
    after = env.get(ENV_AFTER_GENERATION, "")
    if after and not after.isdigit():
        raise ShoalError(f"{ENV_AFTER_GENERATION}={after!r} is not an integer >= 0")
    rendezvous = None if after else rendezvous_from_env(env)
    client = DaemonClient.from_env(env) if env.get("SHOAL_DAEMON_URL") else None
    if rendezvous is None:
        client = client or DaemonClient.from_env(env)
        local_rank = env.get("LOCAL_RANK", "0")
        if not local_rank.isdigit():
            raise ShoalError(f"LOCAL_RANK={local_rank!r} is not an integer >= 0")
        rendezvous = wait_for_rank(client, int(local_rank), join_s, int(after or -1))
    return TrainingSession(
        rendezvous,
        client,
        collective_s=collective_s,
        join_s=join_s,
        report_interval_s=report_interval_s,
        measure_compute=measure_compute,
        in_place=reform == "in_place",
    )
