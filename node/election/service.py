"""Wires the election into a running node: voters, the elector over HTTP, plans into status,
membership changes into re-plans, and the /v1/rendezvous endpoint for training processes. The
training launcher is node.training's: it listens to the plans through `plan_listeners`."""

from __future__ import annotations

import functools
import logging
import random
import re
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from config import ConfigError, Inventory, NodeSettings
from config.declare import READ, Refusal, route
from health import CheckResult, HealthStatus
from node.election.adoption import AdoptionLog
from node.election.claims import GPU_CLAIMED
from node.election.elector import Elector, Listener
from node.election.roles import RolePolicy, capabilities_from_meta
from node.election.seams import DrainSource, QuarantineSource, RestartSource, WalDurableState
from node.election.state import ElectionConfig, ElectionEvent
from node.election.transport import HttpElectionTransport, election_breaker_config
from node.errors import RendezvousError
from node.identity.peers import peer_tls
from node.membership.service import EventKind, MemberEvent, Membership, MemberState
from node.plan import PlanFence, RolePlan
from node.runtime import DrainView, NodeRuntime
from node.security import json_error
from node.training.rendezvous import (
    RENDEZVOUS_PATH,
    RUN_NAME,
    RendezvousAnswer,
    RendezvousQuery,
    rendezvous_for,
)
from wal import WriteAheadLog

log = logging.getLogger(__name__)

STORAGE_NOTE = "election: "
"""Prefix of the /v1/status note saying why the election state cannot be stored."""


TRAINING_CHECK_INTERVAL_S = 2.0
REPLAN_EVENTS = frozenset(
    {
        EventKind.JOINED,
        EventKind.ALIVE,
        EventKind.DEAD,
        EventKind.LEFT,
        EventKind.UPDATED,
        EventKind.REAPED,
    }
)


@dataclass(frozen=True)
class VoterSet:
    """The fixed voters; `configured` is False for a lone node that defaulted to itself."""

    voters: tuple[str, ...]
    configured: bool


def resolve_voters(settings: NodeSettings, inventory: Inventory | None, node_id: str) -> VoterSet:
    """The inventory's voters, else `--voters`, else this node alone (a one-voter cluster)."""
    if inventory is not None:
        if settings.voters and tuple(settings.voters) != inventory.voters:
            raise ConfigError(
                f"voters: --voters {','.join(settings.voters)} conflicts with the inventory's "
                f"voters {','.join(inventory.voters)}; set them in one place only"
            )
        return VoterSet(inventory.voters, True)
    if settings.voters:
        return VoterSet(tuple(settings.voters), True)
    return VoterSet((node_id,), False)


class ElectionService:
    """Owns the elector and its transport for one node, and serves GET /v1/rendezvous (its
    declared handler; node.election.routes serves the elector)."""

    def __init__(self, runtime: NodeRuntime, voter_set: VoterSet) -> None:
        self._runtime = runtime
        self._voter_set = voter_set
        self.elector: Elector | None = None
        self._warned_unconfigured = False
        self._stack = AsyncExitStack()
        self.membership: Membership | None = None
        self.group_handlers: dict[str, Callable[[web.Request], Awaitable[web.Response]]] = {}
        """Other groups served at GET /v1/rendezvous?group=NAME (node.rl adds `weights`)."""
        self.drains: DrainSource | None = None
        self.quarantines: QuarantineSource | None = None
        """Where the coordinator reads the drained and the quarantined nodes (node.locks.nodes
        sets both before `start`); None: plans keep the previous plan's."""
        self.restarts: RestartSource | None = None
        """The restart of the training group asked of this node as coordinator
        (node.training sets it before `start`)."""
        self.plan_listeners: list[Listener] = []
        """Told of every election event once the elector runs (node.training's launcher)."""

    def plan(self) -> RolePlan | None:
        """The plan this node holds (None until its elector runs and has one)."""
        return None if self.elector is None else self.elector.plan

    def plan_fence(self) -> PlanFence | None:
        """The fence of the plan this node holds: what its fenced requests present."""
        plan = self.plan()
        return None if plan is None else plan.fence

    @route(
        "GET",
        RENDEZVOUS_PATH,
        callers=READ,
        answers=((200, "rendezvous"),),
        errors=[
            Refusal(400, "bad_request", "a bad query: local_rank outside this node's local ranks"),
            Refusal(404, "not_found", "no such group"),
            Refusal(409, "conflict", "this node has no plan yet"),
        ],
        query=RendezvousQuery,
        answer=RendezvousAnswer,
    )
    async def _rendezvous(self, request: web.Request) -> web.Response:
        """The training rendezvous of this node's local rank I (default 0): rank (global),
        local_rank, local_world_size, node_rank, nnodes, world_size, master_addr, master_port,
        backend, generation, cuda_device; ?group=weights&run=R the run's weights group"""
        group = request.query.get("group", "training")
        unknown = sorted(set(request.query) - {"group", "run", "local_rank"})
        if unknown:
            return json_error(
                400, f"unknown query parameter(s) {', '.join(unknown)}", param=unknown[0]
            )
        if "run" in request.query and not re.match(RUN_NAME, request.query["run"]):
            return json_error(400, f"run {request.query['run']!r} is not a run name", param="run")
        text = request.query.get("local_rank", "0")
        if not text.isdigit():  # whatever the group: the document says what it takes
            return json_error(
                400, f"local_rank {text!r} must be an integer >= 0", param="local_rank"
            )
        if group != "training":
            handler = self.group_handlers.get(group)
            if handler is None:
                known = ", ".join(["training", *sorted(self.group_handlers)])
                return json_error(404, f"no group {group!r}; groups are {known}", param="group")
            return await handler(request)
        plan = self.elector.plan if self.elector is not None else None
        try:
            rendezvous = rendezvous_for(
                plan,
                self._runtime.node_id,
                int(text),
                owns_gpus=bool(self._runtime.owned_gpus),
            )
        except RendezvousError as exc:
            return json_error(400, str(exc), param="local_rank")
        if rendezvous is None:
            return json_error(409, "no role plan yet: no coordinator has published one")
        return web.json_response(rendezvous.to_dict())

    def _add_gpu_claims_check(self) -> None:
        if self._runtime.health is not None:
            self._runtime.health.add_check(
                "gpu_claims", self._gpu_claims_check, interval_s=TRAINING_CHECK_INTERVAL_S
            )

    async def start(
        self,
        membership: Membership,
        inventory: Inventory | None,
        secret: bytes | None,
        wal: WriteAheadLog,
        rng: random.Random,
    ) -> Elector:
        runtime = self._runtime
        settings = runtime.settings

        def address_of(node_id: str) -> tuple[str, int] | None:
            member = membership.member(node_id)
            if member is not None:
                return (member.address, member.port)
            host = inventory.hosts.get(node_id) if inventory is not None else None
            return (host.address, host.p2p_port) if host is not None else None

        capabilities = functools.partial(_alive_capabilities, membership, inventory)
        transport = HttpElectionTransport(
            runtime.node_id,
            address_of,
            secret=secret,
            timeout_s=settings.timeouts.lease_s,
            breakers=runtime.breakers,
            breaker_config=election_breaker_config(runtime.breakers.config, settings.timeouts),
            cluster=settings.cluster_name,
            tls=peer_tls(runtime),
        )
        await self._stack.enter_async_context(transport)
        adoption_log = None
        if settings.adoption_log is not None:
            adoption_log = AdoptionLog(Path(settings.adoption_log))
            await self._stack.enter_async_context(adoption_log)
        elector = Elector(
            ElectionConfig.from_timeouts(
                runtime.node_id, self._voter_set.voters, settings.timeouts
            ),
            transport,
            WalDurableState(wal),
            capabilities=capabilities,
            drains=self.drains,
            quarantines=self.quarantines,
            restarts=self.restarts,
            policy=RolePolicy(
                min_training=settings.min_training,
                max_training=settings.max_training,
                master_port=settings.master_port,
                backend=settings.backend,
            ),
            adoption_log=adoption_log,
            rng=rng,
        )
        self._add_gpu_claims_check()
        self.membership = membership
        elector.add_listener(self._on_election_event)
        for listener in self.plan_listeners:
            elector.add_listener(listener)
        await self._stack.enter_async_context(elector)
        self.elector = elector
        self._apply_status(elector)
        self._runtime.refreshers.append(self._refresh)
        self._stack.callback(membership.add_listener(self._membership_listener(membership)))
        return elector

    async def _gpu_claims_check(self) -> CheckResult:
        """Degraded while the applied plan refuses this node a rank because another node claims
        one of its GPUs (fix `gpus` on one of them); not applicable without GPUs."""
        runtime = self._runtime
        plan = self.elector.plan if self.elector is not None else None
        reason = plan.cannot_train.get(runtime.node_id) if plan is not None else None
        if reason is not None and reason.startswith("GPU ") and GPU_CLAIMED in reason:
            return CheckResult(
                HealthStatus.DEGRADED,
                f"{reason}: this node gets no training rank; give the nodes on this host "
                "disjoint `gpus`",
            )
        owned = runtime.owned_gpus
        if not owned:
            return CheckResult(HealthStatus.NOT_APPLICABLE, "this node owns no GPU")
        return CheckResult(
            HealthStatus.HEALTHY,
            f"owns GPUs {','.join(map(str, owned))}; {runtime.training_nproc} training processes",
        )

    def _membership_listener(self, membership: Membership) -> Callable[[MemberEvent], None]:
        voters = set(self._voter_set.voters)
        node_id = self._runtime.node_id

        def on_event(event: MemberEvent) -> None:
            elector = self.elector
            if elector is None:
                return
            alive = [m for m in membership.members() if m.state is MemberState.ALIVE]
            elector.set_observers(
                m.node_id for m in alive if m.node_id not in voters and m.node_id != node_id
            )
            if event.kind in REPLAN_EVENTS:
                elector.notify_membership_changed()
            if not self._voter_set.configured and len(alive) > 1:
                self._report_unconfigured(len(alive) - 1)

        return on_event

    def _report_unconfigured(self, peers: int) -> None:
        note = (
            "no voter set configured: this node coordinates only itself although it sees "
            f"{peers} peer(s); set cluster.voters in the inventory or --voters to elect one "
            "coordinator for the cluster"
        )
        if not self._warned_unconfigured:
            self._warned_unconfigured = True
            log.warning("%s", note)
            self._runtime.notes.append(note)

    def _on_election_event(self, event: ElectionEvent) -> None:
        if self.elector is not None:
            self._apply_status(self.elector)
        log.info(
            "election: %s (term %d, coordinator %s, plan %s)",
            event.kind.value,
            event.status.term,
            event.status.coordinator,
            event.status.plan_version,
        )

    def _refresh(self) -> None:
        if self.elector is not None:
            self._apply_status(self.elector)

    def _apply_status(self, elector: Elector) -> None:
        runtime = self._runtime
        status = elector.status
        runtime.term = status.term
        runtime.coordinator = status.coordinator
        plan = elector.plan
        runtime.plan_version = plan.version if plan is not None else None
        drain = plan.draining if plan is not None else {}
        runtime.drain = (
            DrainView(kill_after_s=drain[runtime.node_id]) if runtime.node_id in drain else None
        )
        role = plan.role_of(runtime.node_id) if plan is not None else None
        runtime.role = role.value if role is not None else runtime.settings.role.value
        notes = [note for note in runtime.notes if not note.startswith(STORAGE_NOTE)]
        if elector.storage_problem is not None:
            notes.append(f"{STORAGE_NOTE}{elector.storage_problem}")
        runtime.notes[:] = notes

    async def close(self) -> None:
        """Stop the elector, then its transport. Idempotent."""
        self.elector = None
        await self._stack.aclose()


def _alive_capabilities(membership: Membership, inventory: Inventory | None) -> list[Any]:
    """What each alive member can do (its meta, and its inventory entry when there is one)."""
    hosts = inventory.hosts if inventory is not None else {}
    return [
        capabilities_from_meta(m.node_id, m.address, m.meta, hosts.get(m.node_id))
        for m in membership.members()
        if m.state is MemberState.ALIVE
    ]
