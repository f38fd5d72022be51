"""A drained node and its jobs: refuse new jobs while the plan drains this node, and kill the
running ones once the drain's `kill_after_s` has passed (they finish when it is null)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from node.errors import JobError
from node.jobs.service import JobService
from node.plan import RolePlan

log = logging.getLogger(__name__)

DRAIN_TICK_S = 0.25
DRAIN_KILL_SIGNAL = "SIGTERM"
"""The signal a drain kills with (as the job API names it), then SIGKILL after the node's
`jobs.kill_grace_s`."""


def refuse_if_draining(plan: RolePlan | None, node_id: str) -> None:
    """JobError 409 `node_draining` when `plan` drains `node_id`: no new job starts there."""
    if plan is not None and plan.is_draining(node_id):
        raise JobError(
            409,
            "node_draining",
            f"node {node_id} is draining (shoal node drain): it takes no new jobs; start the "
            f"job on another node, or undrain it with: shoal node undrain {node_id}",
        )


class DrainKiller:
    """While the plan drains this node with a `kill_after_s`, kills every job of the node that
    still runs that many seconds after this node first saw the drain. Owns one task."""

    def __init__(
        self,
        node_id: str,
        service: JobService,
        plan: Callable[[], RolePlan | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._node_id = node_id
        self._service = service
        self._plan = plan
        self._clock = clock
        self._since: float | None = None
        self._killed: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"drain-killer-{self._node_id}")

    async def close(self) -> None:
        """Stop the task. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def due(self, now: float) -> bool:
        """Whether the running jobs are to be killed now (and tracks when the drain began)."""
        plan = self._plan()
        if plan is None or not plan.is_draining(self._node_id):
            self._since = None
            self._killed.clear()
            return False
        if self._since is None:
            self._since = now
        after_s = plan.draining[self._node_id]
        return after_s is not None and now - self._since >= after_s

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(DRAIN_TICK_S)
            if not self.due(self._clock()):
                continue
            for entry in self._service.entries():
                if entry.state.ended or entry.job_id in self._killed:
                    continue
                self._killed.add(entry.job_id)
                try:
                    await self._service.kill(
                        entry.job_id, DRAIN_KILL_SIGNAL, self._service.settings.kill_grace_s
                    )
                except JobError as exc:
                    log.warning("drain: cannot kill job %s: %s", entry.job_id, exc)
                else:
                    log.warning(
                        "drain: killed job %s, still running after the drain's kill_after_s",
                        entry.job_id,
                    )
