"""The node's training command in a running daemon: the launcher started on the first plan (once
the API listens), given each adopted plan's rendezvous, its failures turned into a restart of
the whole group, and this node's `cannot_train` meta while its command keeps failing."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import Protocol

from config import cuda_env, restricts_gpus
from health import CheckResult, HealthStatus
from net import peer_url
from node.election.roles import CANNOT_TRAIN_META
from node.errors import MembershipError
from node.plan import RolePlan
from node.runtime import NodeRuntime
from node.training.launcher import TrainingLauncher, launcher_check
from node.training.rendezvous import rendezvous_for
from node.training.spares import SparePool
from node.training.torchrun import training_base_env
from node.training.workers import LauncherState

log = logging.getLogger(__name__)

CANNOT_TRAIN_REASON_CHARS = 200
"""The reason a node gossips for `cannot_train` is cut to this length (meta values stay short)."""
CANNOT_TRAIN_MIN_CHARS = 40
"""...and further, down to this, while the whole meta is too large to gossip."""


class MetaMembership(Protocol):
    """The part of membership that carries this node's meta."""

    def update_meta(self, changes: Mapping[str, str]) -> None: ...


class Launching:
    """Owns the node's TrainingLauncher when `training_command` is set. `failed(generation,
    error)` is told of each worker failure; `replan()` wakes the coordinator after this node's
    `cannot_train` changed."""

    def __init__(
        self,
        runtime: NodeRuntime,
        membership: Callable[[], MetaMembership | None],
        failed: Callable[[int, str], None],
        replan: Callable[[], None],
    ) -> None:
        self._runtime = runtime
        self._membership = membership
        self._failed = failed
        self._replan = replan
        self.launcher: TrainingLauncher | None = None
        self._applies: set[asyncio.Task[None]] = set()
        self._able_again: asyncio.TimerHandle | None = None
        self._closed = False

    def workers_running(self) -> int:
        launcher = self.launcher
        if launcher is None or launcher.status.state is not LauncherState.RUNNING:
            return 0
        return sum(1 for worker in launcher.status.workers if worker.pid is not None)

    def adopted(self, plan: RolePlan | None) -> None:
        """Run the workers of `plan`'s rendezvous (a forced restart keeps counting failures)."""
        settings = self._runtime.settings
        if self._closed or not settings.training_command:
            return
        launcher = self.launcher or self._start()
        rendezvous = rendezvous_for(
            plan, self._runtime.node_id, owns_gpus=bool(self._runtime.owned_gpus)
        )
        forced = plan is not None and bool(plan.restart)
        task = asyncio.get_running_loop().create_task(
            launcher.apply(rendezvous, keep_failures=forced)
        )
        self._applies.add(task)
        task.add_done_callback(self._applied)

    async def check(self) -> CheckResult:
        """The `training` health component (node.training.launcher's launcher_check)."""
        if self.launcher is None:
            return CheckResult(HealthStatus.HEALTHY, "idle: no plan yet or no training command")
        return await launcher_check(self.launcher)()

    def _start(self) -> TrainingLauncher:
        runtime, settings = self._runtime, self._runtime.settings
        assert settings.training_command
        data_dir = settings.data_dir
        env = training_base_env(
            os.environ,
            settings.training_env,
            peer_url(runtime.address, runtime.port),
            cuda_env(runtime.owned_gpus) if restricts_gpus(settings.gpus) else {},
            settings.timeouts,
            checkpoint_dir=settings.checkpoint_dir,
            reform=settings.training_reform,
        )
        spares = None
        if settings.training_spares:
            spares = SparePool(
                settings.training_command,
                data_dir,
                env,
                settings.training_spares,
                data_dir / "training-spares.log",
            )
            spares.fill()
        self.launcher = TrainingLauncher(
            settings.training_command,
            data_dir,
            data_dir / "training.log",
            env,
            stop_timeout_s=min(5.0, settings.timeouts.shutdown_s / 2),
            max_failures=settings.training_max_failures,
            failure_window_s=settings.training_failure_window_s,
            on_give_up=self._cannot_train,
            on_failure=self._failed,
            spares=spares,
            in_place=settings.training_reform == "in_place",
        )
        return self.launcher

    def _applied(self, task: asyncio.Task[None]) -> None:
        self._applies.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("training launcher: %s", task.exception())

    def _cannot_train(self, reason: str) -> None:
        """The launcher gave up: tell the coordinator (through membership meta) that this node
        cannot train, for one failure window, then offer this node again."""
        self.set_cannot_train(reason)
        self._cancel_able_again()
        window_s = self._runtime.settings.training_failure_window_s
        loop = asyncio.get_running_loop()
        self._able_again = loop.call_later(window_s, self.set_cannot_train, "")

    def set_cannot_train(self, reason: str) -> None:
        """Gossip `reason` as this node's `cannot_train` (empty: it can train again), cut to
        what the meta has room for."""
        membership = self._membership()
        if membership is None:
            return
        reason = reason[:CANNOT_TRAIN_REASON_CHARS]
        while True:
            try:
                membership.update_meta({CANNOT_TRAIN_META: reason})
                break
            except MembershipError as exc:
                if len(reason) <= CANNOT_TRAIN_MIN_CHARS:
                    log.error("cannot tell the cluster that this node cannot train: %s", exc)
                    return
                # the rest of the meta (many GPUs) leaves less room: say less
                reason = reason[: max(CANNOT_TRAIN_MIN_CHARS, len(reason) * 2 // 3)]
        if reason:
            log.warning("this node cannot train and gives up its rank: %s", reason)
        else:
            log.info("this node offers itself for training again")
            if self.launcher is not None:
                self.launcher.forgive()
        self._replan()

    def _cancel_able_again(self) -> None:
        if self._able_again is not None:
            self._able_again.cancel()
            self._able_again = None

    async def close(self) -> None:
        """Stop the workers; idempotent."""
        self._closed = True
        self._cancel_able_again()
        for task in list(self._applies):
            task.cancel()
        await asyncio.gather(*self._applies, return_exceptions=True)
        if self.launcher is not None:
            await self.launcher.close()
            if self.launcher.spares is not None:
                await self.launcher.spares.close()
