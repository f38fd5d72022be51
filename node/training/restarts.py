"""Restarts of the training group: the log every node keeps of the generations it adopted (with
why, counted in `shoal_training_restarts_total{reason}`, audited by the coordinator), and the
coordinator's desk where a restart is asked for (a hang it saw, a worker that exited anywhere)
until a plan carries it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from node.audit.entries import TRAINING_RESTART, record_audit
from node.plan import RestartRequest, RolePlan
from node.runtime import NodeRuntime
from node.training.models import MAX_DETAIL_CHARS, Restart, RestartAnswer, RestartReason
from node.training.watch import restart_reason

log = logging.getLogger(__name__)

MAX_RESTARTS = 100
"""Restarts kept (the newest); /v1/training lists them."""


class RestartLog:
    """The restarts this node saw: each adopted plan compared with the one before it."""

    def __init__(
        self,
        runtime: NodeRuntime,
        registry: CollectorRegistry | None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._runtime = runtime
        self._wall_clock = wall_clock
        self._previous: RolePlan | None = None
        self.restarts: deque[Restart] = deque(maxlen=MAX_RESTARTS)
        self._audits: set[asyncio.Task[None]] = set()
        self._counter = (
            None
            if registry is None
            else Counter(
                "shoal_training_restarts",
                "Restarts of the training group this node adopted, by reason (hang, "
                "worker_exit, member_lost, gpu_fault, plan_change); every node counts them",
                ["reason"],
                registry=registry,
            )
        )
        if self._counter is not None:
            for reason in RestartReason:
                self._counter.labels(reason.value)

    def adopted(self, plan: RolePlan, coordinator: bool) -> Restart | None:
        """Record `plan` (just adopted): the restart it makes of the previous plan's group, if
        any; the coordinator audits it."""
        previous, self._previous = self._previous, plan
        found = restart_reason(previous, plan)
        if found is None:
            return None
        reason, detail = found
        restart = Restart(
            at=self._wall_clock(),
            generation=plan.generation,
            reason=reason,
            detail=detail[:MAX_DETAIL_CHARS],
        )
        self.restarts.append(restart)
        if self._counter is not None:
            self._counter.labels(reason.value).inc()
        log.warning(
            "node %s term %s: training group restarted as generation %s: %s (%s)",
            self._runtime.node_id,
            plan.term,
            plan.generation,
            reason.value,
            detail,
        )
        if coordinator:
            payload = {"name": f"generation {plan.generation}", **restart.to_json()}
            task = asyncio.get_running_loop().create_task(self._audit(payload))
            self._audits.add(task)
            task.add_done_callback(self._audits.discard)
        return restart

    async def _audit(self, payload: dict[str, object]) -> None:
        await record_audit(self._runtime.wal, TRAINING_RESTART, payload, self._runtime.node_id)

    async def close(self) -> None:
        """Wait for the audit entries being written."""
        await asyncio.gather(*self._audits, return_exceptions=True)


class RestartDesk:
    """At the coordinator: the restart of the group asked for and not yet planned (the elector
    reads it through `pending`); `replan` wakes the elector."""

    def __init__(self, replan: Callable[[], None]) -> None:
        self._replan = replan
        self._pending: RestartRequest | None = None

    def pending(self) -> RestartRequest | None:
        return self._pending

    def adopted(self, plan: RolePlan) -> None:
        """A plan of a newer generation settles the pending request."""
        if self._pending is not None and plan.generation > self._pending.generation:
            self._pending = None

    def ask(
        self, plan: RolePlan | None, generation: int, reason: RestartReason, detail: str
    ) -> RestartAnswer:
        """Restart the group of `generation` (it must be the plan's: a request about an older
        generation is answered, not acted on); idempotent per generation."""
        current = None if plan is None else plan.generation
        if plan is None or not plan.training_ranks or generation != current:
            why = "no training group" if plan is None or not plan.training_ranks else "stale"
            return RestartAnswer(accepted=False, generation=current, reason=f"{why}: {current}")
        if self._pending is None or self._pending.generation != generation:
            text = f"{reason.value}: {detail}" if detail else reason.value
            self._pending = RestartRequest(generation, text[:MAX_DETAIL_CHARS])
            log.warning("restarting training generation %s: %s", generation, text)
            self._replan()
        return RestartAnswer(accepted=True, generation=current, reason=self._pending.reason)
