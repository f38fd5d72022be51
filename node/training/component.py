"""The training part of a daemon: the launcher of the training command, its ranks' progress
reports, the restarts of the group, and at the coordinator the watch that restarts a hung group
and flags stragglers. A component (node.component): its routes are node.training.routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import JsonValue

from health import LoopHealth
from net import Identity, PeerClient, PeerRequestError
from node.component import Check, Endpoint, endpoints
from node.election.service import ElectionService
from node.election.state import ElectionEvent, ElectionEventKind, ElectionRole
from node.identity.peers import peer_tls
from node.plan import RolePlan
from node.runtime import NodeRuntime
from node.training.gpus import GpuRing, GpuSampler
from node.training.launching import Launching
from node.training.metrics import TrainingCollector
from node.training.models import (
    MAX_DETAIL_CHARS,
    NODE_PATH,
    RESTART_PATH,
    NodeProgress,
    ReportsAnswer,
    ReportsBody,
    RestartAnswer,
    RestartBody,
    RestartReason,
    StragglerEvent,
    TrainingView,
)
from node.training.progress import ProgressStore, summary
from node.training.restarts import RestartDesk, RestartLog
from node.training.routes import TrainingRoutes
from node.training.view import Judging, build_view, gather

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
"""How often the coordinator reads the group's progress and judges it."""
PART_TIMEOUT_S = 2.0
"""The most one training node's part may take (capped by peer_status_s): a slower node is
named in `missing`."""
MAX_EVENTS = 50
CHECK_INTERVAL_S = 2.0

Drain = Callable[[str, str], Awaitable[object]]
"""Drain a node (node id, why): node.locks.nodes at the coordinator (straggler_action drain)."""


class TrainingComponent:
    """See the module docstring. Attaches itself to `election` when made (before it starts):
    the coordinator plans with its restart desk, and every node hears the plans."""

    def __init__(
        self, runtime: NodeRuntime, election: ElectionService, secret: bytes | None
    ) -> None:
        self.runtime = runtime
        self._election = election
        self._secret = secret
        settings = runtime.settings
        self.store = ProgressStore(runtime.node_id, settings.straggler_window, gpu_of=self._gpu_of)
        registry = runtime.metrics.registry if runtime.metrics is not None else None
        self.restarts = RestartLog(runtime, registry)
        self.desk = RestartDesk(self._replan)
        self.launching = Launching(
            runtime, lambda: election.membership, self._worker_failed, self._replan
        )
        self.events: deque[StragglerEvent] = deque(maxlen=MAX_EVENTS)
        self.stragglers: dict[int, str] = {}
        """The ranks flagged in the coordinator's last judgement, with their nodes."""
        self.drain: Drain | None = None
        """Set by the daemon's wiring where the lock service can drain (straggler_action)."""
        self.node_parts: dict[str, Callable[[], JsonValue]] = {}
        """Parts each node adds to its share of /v1/training (`last_restore`), by key."""
        self.committed: Callable[[], JsonValue] | None = None
        """The document's `committed` (node.checkpoints), read where the document is built."""
        self._collector = TrainingCollector(self.store, lambda: self.stragglers)
        self._peers: PeerClient | None = None
        self._watch: asyncio.Task[None] | None = None
        self.watch_health = LoopHealth("training_watch")
        """The coordinator's judgement of the group, each round (its health component)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._broken: int | None = None
        """The generation a rank last reported broken (one restart asked per generation)."""
        self._gpus: dict[int, str] = {}
        self.gpu_ring = GpuRing()
        """This node's owned GPUs' last 15 minutes (utilization, memory), served with the
        history."""
        election.restarts = self.desk.pending
        election.plan_listeners.append(self._on_event)

    @property
    def plan(self) -> RolePlan | None:
        elector = self._election.elector
        return None if elector is None else elector.plan

    def is_coordinator(self) -> bool:
        elector = self._election.elector
        return elector is not None and elector.state.role is ElectionRole.COORDINATOR

    def status(self) -> Mapping[str, object] | None:
        """The status document's `training`: this node's ranks' generation, count, highest
        step and median steps/s, None while none reports."""
        return summary(self.store.ranks())

    async def open(self) -> None:
        runtime = self.runtime
        self._peers = PeerClient(
            Identity(self._secret, runtime.node_id, runtime.settings.cluster_name),
            timeouts=runtime.settings.timeouts,
            tls=peer_tls(runtime),
        )
        if runtime.metrics is not None:
            runtime.metrics.registry.register(self._collector)
        self._watch = asyncio.create_task(self._watch_loop(), name="training-watch")
        sampler = GpuSampler(
            self.gpu_ring,
            runtime.gpus,
            lambda: runtime.owned_gpus,
            runtime.settings.timeouts.gpu_read_s,
        )
        self._spawn(sampler.run())

    def routes(self) -> list[Endpoint]:
        return endpoints(TrainingRoutes(self))

    def checks(self) -> Mapping[str, Check]:
        return {
            "training": Check(self.launching.check, interval_s=CHECK_INTERVAL_S),
            self.watch_health.name: Check(self.watch_health.check, interval_s=CHECK_INTERVAL_S),
        }

    async def close(self) -> None:
        """Stop the watch and the workers. Idempotent."""
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        await self.launching.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.restarts.close()
        if self.runtime.metrics is not None:
            with contextlib.suppress(KeyError):
                self.runtime.metrics.registry.unregister(self._collector)
        if self._peers is not None:
            await self._peers.close()
            self._peers = None

    def accept(self, body: ReportsBody) -> ReportsAnswer:
        """Keep a process's reports (POST /v1/training/reports)."""
        self._follow_plan()
        accepted = self.store.accept(body)
        current = self.store.generation
        if body.broken and body.generation == current and self._broken != current:
            # an in-place rank's group broke (a peer's worker died with its host, say): ask for
            # the next generation once, as the launcher does for an exited worker
            self._broken = current
            self._worker_failed(current, f"rank {body.rank}: {body.broken}")
        return ReportsAnswer(accepted=accepted, generation=current)

    def _follow_plan(self) -> None:
        """The store follows the plan this node holds (its listener hears of a plan only once
        it is stored, a moment after the rendezvous shows it)."""
        plan = self.plan
        if plan is not None:
            self.store.set_generation(plan.generation if plan.training_ranks else None)

    def node_progress(self, history: bool = False) -> NodeProgress:
        """This node's part of the group (GET /v1/training/node)."""
        self._follow_plan()
        parts = {key: part() for key, part in self.node_parts.items()}
        return NodeProgress(
            node=self.runtime.node_id,
            generation=self.store.generation,
            generation_age_s=self.store.generation_age_s(),
            reporting=self.store.reporting,
            workers_running=self.launching.workers_running(),
            ranks=self.store.ranks(),
            parts=parts,
            history=self.store.history() if history else None,
            gpu_history=self.gpu_ring.history() if history else None,
        )

    async def view(self, history: bool = False) -> TrainingView:
        """The whole group's document, gathered by this node."""
        timeouts = self.runtime.settings.timeouts
        plan = self.plan
        parts, missing = await gather(
            plan,
            self.node_progress(history),
            self._fetch_part,
            min(PART_TIMEOUT_S, timeouts.peer_status_s),
            history=history,
        )
        settings = self.runtime.settings
        return build_view(
            answered_by=self.runtime.node_id,
            coordinator=self.runtime.coordinator,
            plan=plan,
            parts=parts,
            missing=missing,
            judging=Judging(
                settings.training_hang_s,
                timeouts.quorum_s,
                settings.straggler_factor,
                settings.straggler_window,
            ),
            generation_age_s=self.store.generation_age_s(),
            restarts=self.restarts.restarts,
            events=self.events,
            committed=None if self.committed is None else self.committed(),
            history=history,
        )

    async def coordinator_view(self, history: bool) -> TrainingView:
        """The coordinator's document when it answers in time (it knows the straggler events),
        else this node's own."""
        coordinator = self.runtime.coordinator
        if coordinator is not None and coordinator != self.runtime.node_id:
            query = "?history=1" if history else ""
            try:
                answer = await self._call(coordinator, "GET", f"/v1/training{query}")
                return TrainingView.model_validate(answer)
            except (PeerRequestError, TimeoutError, ValueError, LookupError) as exc:
                log.debug("training: %s did not answer /v1/training: %s", coordinator, exc)
        return await self.view(history)

    async def ask_restart(self, body: RestartBody) -> RestartAnswer:
        """At the coordinator: restart the group of `body.generation`."""
        return self.desk.ask(self.plan, body.generation, RestartReason(body.reason), body.detail)

    def _gpu_of(self, local_rank: int) -> str | None:
        """The GPU local rank `local_rank` trains on: its UUID (read once), else its index."""
        owned = self.runtime.owned_gpus
        if local_rank >= len(owned):
            return None
        known = self._gpus.get(local_rank)
        if known is None:
            try:
                gpus = self.runtime.gpus()
            except Exception:  # a failing driver shows in the gpu check; ask again next time
                return str(owned[local_rank])
            index = owned[local_rank]
            uuid = gpus[index].get("uuid") if index < len(gpus) else None
            known = self._gpus[local_rank] = str(uuid or index)
        return known

    def _replan(self) -> None:
        elector = self._election.elector
        if elector is not None:
            elector.notify_membership_changed()

    def _on_event(self, event: ElectionEvent) -> None:
        plan = event.plan
        if event.kind is not ElectionEventKind.PLAN_ADOPTED or plan is None:
            return
        self._follow_plan()
        self.restarts.adopted(plan, coordinator=self.is_coordinator())
        self.desk.adopted(plan)
        self.launching.adopted(plan)

    def _worker_failed(self, generation: int, error: str) -> None:
        """A worker of this node failed: the whole group restarts (the others would wait for
        it in a collective)."""
        detail = error[:MAX_DETAIL_CHARS]
        body = RestartBody(generation=generation, reason="worker_exit", detail=detail)
        self._spawn(self._request_restart(body))

    async def _request_restart(self, body: RestartBody) -> None:
        if self.is_coordinator():
            await self.ask_restart(body)
            return
        coordinator = self.runtime.coordinator
        if coordinator is None:
            return
        try:
            await self._call(coordinator, "POST", RESTART_PATH, body.model_dump(mode="json"))
        except (PeerRequestError, TimeoutError, LookupError) as exc:
            log.warning("training: cannot ask %s to restart the group: %s", coordinator, exc)

    async def _fetch_part(self, node: str, history: bool) -> NodeProgress:
        answer = await self._call(node, "GET", NODE_PATH + ("?history=1" if history else ""))
        return NodeProgress.model_validate(answer)

    async def _call(self, node: str, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer of `node` (an alive member); LookupError when it is not one,
        PeerRequestError when it fails or refuses."""
        peers, membership = self._peers, self.runtime.membership
        member = next(
            (m for m in (membership.members() if membership else ()) if m.node_id == node), None
        )
        if peers is None or member is None:
            raise LookupError(f"{node} is not in this node's view")
        url = peers.base_url(f"{member.address}:{member.port}")
        timeout_s = min(PART_TIMEOUT_S, self.runtime.settings.timeouts.peer_status_s)
        return await peers.request_json(method, url, path, body, timeout_s=timeout_s)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if not self.is_coordinator() or self.plan is None or not self.plan.training_ranks:
                self.watch_health.record_success("no training group to judge on this node")
                continue
            try:
                await self._judge(await self.view())
            except Exception as exc:  # recorded in health; the next round retries
                level = logging.DEBUG if self.watch_health.consecutive_failures else logging.WARNING
                log.log(level, "training: judging the group failed: %r", exc)
                self.watch_health.record_failure(exc)
            else:
                self.watch_health.record_success(f"generation {self.plan.generation}")

    async def _judge(self, view: TrainingView) -> None:
        """At the coordinator: restart a hung group, flag new stragglers (and drain their
        node under straggler_action drain)."""
        plan = self.plan
        if plan is None or view.generation != plan.generation:
            return
        if view.hung:
            ages = [rank.last_advance_age_s for rank in view.ranks]
            detail = (
                f"no rank advanced for {min(ages):.1f} s (timeout {view.hang_timeout_s:g} s)"
                if ages
                else f"no rank reported within {view.hang_timeout_s:g} s of the start"
            )
            self.desk.ask(plan, plan.generation, RestartReason.HANG, detail)
        slow = {rank.rank: rank.node for rank in view.ranks if rank.straggler}
        new = [
            rank for rank in view.ranks if rank.rank in slow and rank.rank not in self.stragglers
        ]
        self.stragglers = slow
        medians = [rank.compute_s for rank in view.ranks if rank.compute_s is not None]
        median = statistics.median(medians) if medians else 0.0
        action = self.runtime.settings.straggler_action
        for rank in new:
            event = StragglerEvent(
                at=time.time(),
                node=rank.node,
                rank=rank.rank,
                gpu=rank.gpu,
                compute_s=rank.compute_s or 0.0,
                median_s=median,
                action=action,
            )
            self.events.append(event)
            log.warning(
                "training: rank %s on %s (GPU %s) straggles: compute %.3f s, median %.3f s (%s)",
                rank.rank,
                rank.node,
                rank.gpu or "-",
                event.compute_s,
                median,
                action,
            )
        if action == "drain" and self.drain is not None:
            for node in sorted({rank.node for rank in new}):
                self._spawn(self._drain(node))

    async def _drain(self, node: str) -> None:
        assert self.drain is not None
        try:
            await self.drain(node, "straggler")
        except Exception as exc:  # the next judgement flags it again only if it is new
            log.warning("training: cannot drain straggling node %s: %s", node, exc)
