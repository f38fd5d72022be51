"""`shoal.training_session()`: what a training script holds for its whole life. It joins this
generation's group (torchrun's environment, else the local daemon's rendezvous), reports
progress without blocking the loop, and saves and restores checkpoints through
`shoal.checkpoint`.

    with shoal.training_session() as session:
        step = session.restore(state) or 0
        while training:
            ...
            session.report(step, loss=loss.item())
            if step % 100 == 0:
                session.save(state, step)
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from types import TracebackType
from typing import Any

from shoal._daemon import DaemonClient
from shoal.compute import CollectiveClock
from shoal.errors import DaemonUnreachableError, GroupError, SessionError, ShoalError
from shoal.group import TrainingGroup, torch_modules
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
POLL_S = 0.2


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    try:
        value = float(text) if text else default
    except ValueError:
        raise ShoalError(f"{name}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise ShoalError(f"{name}={text!r} must be above 0")
    return value


def _wait_for_rank(client: DaemonClient, local_rank: int, timeout_s: float) -> Rendezvous:
    """Ask the daemon for `local_rank`'s rendezvous until it gives one; GroupError after
    `timeout_s` naming the last answer."""
    deadline = time.monotonic() + timeout_s
    problem = "no answer yet"
    while True:
        left_s = deadline - time.monotonic()
        try:
            found = fetch_rendezvous(client, local_rank, max(0.1, min(left_s, 5.0)))
        except DaemonUnreachableError as exc:
            found, problem = None, str(exc)
        else:
            problem = "this node has no training rank (yet)" if found is None else problem
        if found is not None:
            return found
        if left_s <= 0:
            raise GroupError(f"no rank from {client.url} in {timeout_s:.0f} s: {problem}")
        time.sleep(min(POLL_S, max(0.0, left_s)))


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
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.group = TrainingGroup(collective_timeout_s=collective_s, join_timeout_s=join_s)
        self._client = client
        self._place = rendezvous.place
        self._checkpointer: Any = None
        self._superseded = threading.Event()
        self._clock: CollectiveClock | None = None
        _, dist = torch_modules()
        if dist.is_initialized():
            self.group.adopt(rendezvous)
        else:
            self.group.configure(rendezvous)
        self._now = clock
        if measure_compute:
            self._clock = CollectiveClock(clock)
            self._clock.install(dist)
        self._last_report_at: float | None = None
        self._reporter = Reporter(
            client,
            rendezvous.place,
            interval_s=report_interval_s,
            on_failure=self.group.report_error,
            on_generation=self._daemon_generation,
        )
        self._closed = False

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

    def restore(self, state: MutableMapping[str, Any]) -> int | None:
        """Load the newest committed step into `state`: its step, or None when there is none."""
        self._raise_recorded()
        step: int | None = self._checkpoints().restore(state)
        return step

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
            self._checkpointer = module.Checkpointer(self._place, self._client)
        return self._checkpointer

    def _daemon_generation(self, generation: int) -> None:
        """The daemon's current generation (after each post): a newer one supersedes ours, and
        with NCCL the communicator is aborted so a collective blocked on the old group ends."""
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
    join_s = join_timeout_s or _seconds(env, "SHOAL_QUORUM_S", DEFAULT_QUORUM_S)
    collective_s = _seconds(env, "SHOAL_COLLECTIVE_S", DEFAULT_COLLECTIVE_S)
    rendezvous = rendezvous_from_env(env)
    client = DaemonClient.from_env(env) if env.get("SHOAL_DAEMON_URL") else None
    if rendezvous is None:
        client = client or DaemonClient.from_env(env)
        local_rank = env.get("LOCAL_RANK", "0")
        if not local_rank.isdigit():
            raise ShoalError(f"LOCAL_RANK={local_rank!r} is not an integer >= 0")
        rendezvous = _wait_for_rank(client, int(local_rank), join_s)
    return TrainingSession(
        rendezvous,
        client,
        collective_s=collective_s,
        join_s=join_s,
        report_interval_s=report_interval_s,
        measure_compute=measure_compute,
    )
