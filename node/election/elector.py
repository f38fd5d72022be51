"""The elector: runs one node's election state machine on the event loop, persists its vote
before any message leaves, sends through an injected transport, and publishes role plans while
it holds the coordinator lease.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

from config.closing import AsyncClosing
from health import LoopHealth
from node.election import core, seams
from node.election.adoption import AdoptionLog, record_adoption
from node.election.messages import (
    Heartbeat,
    HeartbeatAck,
    Message,
    Outbound,
    PlanAnnounce,
    VoteReply,
    VoteRequest,
)
from node.election.pull import PlanFetcher, PlanPuller, PlanWaiters
from node.election.roles import PlanDebouncer, RolePolicy, compute_plan
from node.election.seams import DurableState, ElectionTransport
from node.election.sender import Sender
from node.election.state import (
    DurableRecord,
    ElectionConfig,
    ElectionEvent,
    ElectionEventKind,
    ElectionRole,
    ElectionState,
    ElectionStatus,
    events_between,
    initial_state,
    lease_backers,
    lease_valid,
    log_event,
    next_plan_version,
    next_wakeup,
    status_of,
    with_observers,
)
from node.errors import ElectionError, PlanError
from node.plan import PlanFence, RolePlan

log = logging.getLogger(__name__)

VOTE_KEY = "election.vote"
"""DurableState key of {"term": int, "voted_for": str | null}, written as one value."""
PLAN_KEY = "election.plan"
"""DurableState key of the newest plan this node adopted (RolePlan.to_dict), or null."""

Listener = Callable[[ElectionEvent], None]


class _Phase(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class Elector(AsyncClosing):
    """One node's elector. `async with Elector(...)` loads the durable vote and starts the timer
    loop; HTTP handlers call `handle_vote_request` and `handle_heartbeat`.

    Invariant: every message a step returns is sent only after the step's durable state (term,
    vote, plan) is stored; there is no await between a step and recording its events.
    """

    def __init__(
        self,
        config: ElectionConfig,
        transport: ElectionTransport,
        durable: DurableState,
        *,
        capabilities: seams.CapabilitiesSource | None = None,
        drains: seams.DrainSource | None = None,
        quarantines: seams.QuarantineSource | None = None,
        restarts: seams.RestartSource | None = None,
        policy: RolePolicy | None = None,
        debounce: PlanDebouncer | None = None,
        adoption_log: AdoptionLog | None = None,
        request_timeout_s: float | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._durable = durable
        self._capabilities = capabilities
        self._drains = drains
        self._quarantines = quarantines
        self._restarts = restarts
        self._policy = policy
        self._debounce = debounce or PlanDebouncer()
        self._adoption_log = adoption_log
        self._rng = rng or random.Random()
        self._clock = clock
        self._wall_clock = wall_clock
        self._phase = _Phase.NEW
        self._state: ElectionState | None = None
        self._observers: frozenset[str] = frozenset()
        self._listeners: list[Listener] = []
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._sender = Sender(
            config.node_id,
            transport,
            request_timeout_s or config.lease_s,
            self._on_reply,
            self._term,
        )
        self._puller: PlanPuller | None = None
        if isinstance(transport, PlanFetcher):
            self._puller = PlanPuller(config.node_id, transport, self._adopt_fetched)
            self.config = replace(config, pulls_plans=True)
        self._plan_waiters = PlanWaiters()
        self._persist_lock = asyncio.Lock()
        self._stored = DurableRecord()
        self._stored_plan: RolePlan | None = None
        self._commit_seq = 0
        self._persisted_seq = 0
        self._queue: deque[tuple[int, ElectionEvent, tuple[str, ...] | None]] = deque()
        self._dispatch_lock = asyncio.Lock()
        self._reverted_seq = 0
        self.storage_problem: str | None = None
        """Why the last write of the term/vote/plan failed (None once one succeeds): the node
        stepped down to what is stored and retries."""
        self.loop_health = LoopHealth("election")
        """Each step of the timer loop, for the `election` health component."""

    async def _enter(self) -> None:
        await self.start()

    async def start(self) -> None:
        """Load the durable vote and plan, then start the timers. Only once."""
        if self._phase is not _Phase.NEW:
            raise ElectionError(f"elector of {self.config.node_id} cannot start twice")
        record = DurableRecord.from_value(await self._durable.get(VOTE_KEY))
        stored_plan = await self._durable.get(PLAN_KEY)
        try:
            plan = None if stored_plan is None else RolePlan.from_dict(stored_plan)
        except PlanError as exc:
            log.warning("node %s: ignoring the stored plan: %s", self.config.node_id, exc)
            plan = None
        self._stored, self._stored_plan = record, plan
        state = initial_state(self.config, record, plan, self._clock(), self._rng)
        self._state = with_observers(state, self._observers)
        self._phase = _Phase.RUNNING
        self._loop_task = asyncio.create_task(self._run(), name=f"elector-{self.config.node_id}")
        log.info(
            "node %s term %s: election started (%d voters, %s)",
            self.config.node_id,
            record.term,
            len(self.config.voters),
            "voter" if self.config.is_voter else "non-voter",
        )

    async def close(self) -> None:
        """Stop the timers and cancel requests in flight. Idempotent and irreversible."""
        if self._phase is _Phase.CLOSED:
            return
        self._phase = _Phase.CLOSED
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self._sender.close()
        if self._puller is not None:
            await self._puller.close()

    @property
    def state(self) -> ElectionState:
        """The current (immutable) election state, in memory: it may run ahead of what is
        durable by one write. Listeners hear of a change only once it is durable."""
        return self._running_state()

    @property
    def status(self) -> ElectionStatus:
        return status_of(self._running_state(), self._clock())

    @property
    def plan(self) -> RolePlan | None:
        return None if self._state is None else self._state.plan

    def plan_announce(self) -> PlanAnnounce:
        """The GET /v1/plan document of this node."""
        status = self.status
        return PlanAnnounce(
            self.config.node_id, status.term, status.coordinator, status.lease_valid, self.plan
        )

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(event)` on every change, after the change is durable; returns remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def set_observers(self, node_ids: Iterable[str]) -> None:
        """The non-voters the coordinator heartbeats (alive members outside the voter set)."""
        self._observers = frozenset(node_ids)
        if self._state is not None:
            self._state = with_observers(self._state, self._observers)

    def notify_membership_changed(self) -> None:
        """A member joined, died or changed; the coordinator re-plans after the debounce."""
        self._debounce = self._debounce.changed(self._clock())
        self._wake.set()

    async def handle_vote_request(self, request: VoteRequest) -> VoteReply:
        """Answer a candidate; a granted vote is durable before this returns."""
        state = self._running_state()
        new, reply = core.handle_vote_request(state, request, self._clock(), self._rng)
        await self._settle(self._commit(state, new))
        return reply

    async def handle_heartbeat(self, heartbeat: Heartbeat) -> HeartbeatAck:
        """Answer the coordinator; a new term or plan is durable before this returns."""
        state = self._running_state()
        new, ack = core.handle_heartbeat(state, heartbeat, self._clock(), self._rng)
        await self._settle(self._commit(state, new))
        if self._puller is not None and ack.success:
            self._puller.consider(heartbeat, self._running_state().plan_fence)
        return ack

    async def _adopt_fetched(self, plan: RolePlan, heartbeat: Heartbeat) -> bool:
        """Adopt a plan fetched after `heartbeat` announced it; True once it is durable."""
        state = self._running_state()
        assert heartbeat.plan_fence is not None
        assert heartbeat.plan_digest is not None
        new = core.adopt_fetched_plan(state, plan, heartbeat.plan_fence, heartbeat.plan_digest)
        if new is state:
            return state.plan_fence is not None and state.plan_fence >= plan.fence
        await self._settle(self._commit(state, new))
        return True

    async def plan_at(self, fence: PlanFence, wait_s: float) -> RolePlan | None:
        """`GET /v1/plan?fence=`: the plan of `fence` once applied here (None: not in `wait_s`)."""
        return await self._plan_waiters.plan_at(fence, wait_s, lambda: self.plan)

    def _running_state(self) -> ElectionState:
        if self._phase is not _Phase.RUNNING or self._state is None:
            raise ElectionError(f"elector of {self.config.node_id} is {self._phase.value}")
        return self._state

    def _commit(self, old: ElectionState, new: ElectionState) -> int:
        """Make `new` current, queue its events (never awaits); its sequence for `_settle`."""
        now = self._clock()
        self._state = new
        self._commit_seq += 1
        for event in events_between(old, new, now):
            backers = None
            if (
                event.kind is ElectionEventKind.PLAN_ADOPTED
                and new.role is ElectionRole.COORDINATOR
            ):
                backers = tuple(sorted(lease_backers(new, now)))
            self._queue.append((self._commit_seq, event, backers))
        if new is not old:
            self._wake.set()
        if new.plan_fence != old.plan_fence:
            self._plan_waiters.changed()
        return self._commit_seq

    async def _settle(self, seq: int | None = None) -> None:
        """Store the newest durable state, then log and deliver the events it covers, in order.

        Nothing is acted on unless stored: when the write fails, the node steps down to the
        state last stored (its newer term, vote, role and plan are dropped with their events),
        says why (`storage_problem`, the election health), and the error propagates (no reply,
        no message is sent); the next round retries. `seq`: the caller's commit, which must
        not have been dropped by another caller's failed write meanwhile."""
        try:
            wrote = await self._persist()
        except Exception as exc:
            self._step_down_unstored(exc)
            raise
        if seq is not None and seq <= self._reverted_seq:
            raise ElectionError("election state was not stored (a write failed); not answering")
        if wrote:
            self.storage_problem = None
        async with self._dispatch_lock:
            while self._queue and self._queue[0][0] <= self._persisted_seq:
                _, event, backers = self._queue.popleft()
                log_event(event)
                for listener in list(self._listeners):
                    try:
                        listener(event)
                    except Exception:
                        log.exception("node %s: election listener failed", self.config.node_id)
                await record_adoption(
                    self._adoption_log, event, self._wall_clock(), backers, self.config.node_id
                )

    def _step_down_unstored(self, exc: BaseException) -> None:
        """A write of the election state failed: back to what is stored, as a follower."""
        stored = self._stored
        self.storage_problem = (
            f"cannot store the election state ({type(exc).__name__}: {exc}); acting on stored "
            f"term {stored.term} as a follower until a write succeeds"
        )
        if self._phase is not _Phase.RUNNING:
            return
        if self._state is not None and self._state.durable != stored:
            log.warning("node %s: %s", self.config.node_id, self.storage_problem)
        state = initial_state(self.config, stored, self._stored_plan, self._clock(), self._rng)
        self._state = with_observers(state, self._observers)
        self._reverted_seq = self._commit_seq
        while self._queue and self._queue[-1][0] > self._persisted_seq:
            self._queue.pop()

    async def _persist(self) -> bool:
        """Store the current state's term, vote and plan where they changed; True if written."""
        async with self._persist_lock:
            seq, state = self._commit_seq, self._running_state()
            wrote = False
            if state.durable != self._stored:
                await self._durable.set(VOTE_KEY, state.durable.to_dict())
                self._stored = state.durable
                wrote = True
            if state.plan is not None and (
                self._stored_plan is None or state.plan_fence != self._stored_plan.fence
            ):
                await self._durable.set(PLAN_KEY, state.plan.to_dict())
                self._stored_plan = state.plan
                wrote = True
            self._persisted_seq = max(self._persisted_seq, seq)
            return wrote

    async def _probe_storage(self) -> None:
        """After a failed write, each round rewrites what is stored until that works again."""
        async with self._persist_lock:
            try:
                await self._durable.set(VOTE_KEY, self._stored.to_dict())
            except Exception as exc:
                self._step_down_unstored(exc)
                raise
        log.info("node %s: election state can be stored again", self.config.node_id)
        self.storage_problem = None

    async def _run(self) -> None:
        failures = 0
        while True:
            self._wake.clear()
            try:
                await self._tick()
                failures = 0
                self.loop_health.record_success()
            except Exception as exc:  # recorded and retried; the loop must keep running
                failures += 1
                self.loop_health.record_failure(self.storage_problem or exc)
                log.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "node %s term %s: election step failed (%d in a row): %r",
                    self.config.node_id,
                    self._state.term if self._state else "-",
                    failures,
                    exc,
                )
            if failures:  # back off, even when woken, so a failing store is not hammered
                await asyncio.sleep(min(0.05 * failures, self.config.heartbeat_interval_s))
                continue
            delay = self._next_wakeup() - self._clock()
            if delay > 0 and not self._wake.is_set():
                try:
                    async with asyncio.timeout(min(delay, 3600.0)):
                        await self._wake.wait()
                except TimeoutError:
                    pass

    async def _tick(self) -> None:
        if self.storage_problem is not None:
            await self._probe_storage()
        state = self._running_state()
        now = self._clock()
        new, outbound = core.on_tick(state, now, self._rng)
        seq = self._commit(state, new)
        outbound += self._maybe_publish(now)
        await self._settle(seq)
        self._sender.send_all(outbound)

    def _next_wakeup(self) -> float:
        state = self._running_state()
        wakeup = next_wakeup(state)
        due = self._debounce.due_at()
        if due is not None and state.role is ElectionRole.COORDINATOR:
            wakeup = min(wakeup, due)
        return wakeup if math.isfinite(wakeup) else self._clock() + 3600.0

    def _maybe_publish(self, now: float) -> list[Outbound]:
        """Publish a plan when this node holds the lease and its term has none yet, or when
        membership changes have settled. Returns the heartbeats that carry it."""
        state = self._running_state()
        if state.role is not ElectionRole.COORDINATOR:
            self._debounce = self._debounce.cleared()
            return []
        if self._capabilities is None or self._policy is None or not lease_valid(state, now):
            return []
        new_term = state.plan is None or state.plan.term != state.term
        if not new_term and not self._debounce.is_due(now):
            return []
        self._debounce = self._debounce.cleared()
        try:
            members = self._capabilities()
            plan = compute_plan(
                state.term,
                next_plan_version(state),
                members,
                self._policy,
                previous=state.plan,
                highest_generation=state.generation,
                draining=None if self._drains is None else self._drains(state.term),
                quarantined=None if self._quarantines is None else self._quarantines(state.term),
                restart=None if self._restarts is None else self._restarts(),
            )
        except (PlanError, ValueError) as exc:
            log.warning("node %s term %s: no plan: %s", self.config.node_id, state.term, exc)
            return []
        if not new_term and plan.same_assignment(state.plan):
            return []
        new, outbound = core.publish_plan(state, plan, now)
        self._commit(state, new)
        return outbound

    async def _on_reply(self, reply: Message) -> None:
        if self._phase is not _Phase.RUNNING:
            return
        state = self._running_state()
        new, outbound = core.on_message(state, reply, self._clock(), self._rng)
        seq = self._commit(state, new)
        try:
            await self._settle(seq)
        except Exception as exc:  # the step's state is dropped; the timer loop retries
            log.debug("node %s: reply not acted on: %r", self.config.node_id, exc)
            return
        self._sender.send_all(outbound)

    def _term(self) -> object:
        return self._state.term if self._state else "-"
