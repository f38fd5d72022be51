"""The named-actor registry of the `shoal` backend: owned by the coordinator and fenced by its
term (a registry whose term moves on forgets the old term's names); other daemons forward the
routes to the coordinator. Claims are atomic get-or-create; a name's incarnation only grows."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, Field

from config.declare import READ, Caller, Refusal, Route, route
from net import Identity, PeerClient, PeerRequestError
from node.component import Check, Endpoint, endpoints
from node.errors import BodyError, RegistryError
from node.identity.peers import peer_tls
from node.openapi import BODY_CONFIG, WholeNumber, WireRecord, parse_body
from node.runtime import NodeRuntime

log = logging.getLogger(__name__)

ACTORS_PATH = "/v1/actors"
FORWARDED_HEADER = "X-Shoal-Forwarded-By"
"""Set on a request one daemon forwards to the coordinator; such a request is never forwarded
again (two daemons that disagree about the coordinator must not bounce it between them)."""
PENDING_TTL_S = 120.0
"""A claim whose creator never reported the actor ready is given up after this long."""


@dataclass(frozen=True)
class ActorRecord:
    """One name's current incarnation: pending (being created), ready (at `address`) or dead."""

    name: str
    incarnation: int
    state: str
    term: int
    address: str = ""
    job: str = ""
    claimed_at: float = 0.0

    def live(self, now: float) -> bool:
        if self.state == "ready":
            return True
        return self.state == "pending" and now - self.claimed_at < PENDING_TTL_S


_INCARNATION = Field(ge=0, le=2**63 - 1, description="the incarnation the claim answered")


class ClaimBody(BaseModel):
    """Body of `POST /v1/actors/{name}/claim` (optional): atomic get-or-create."""

    model_config = BODY_CONFIG

    get_if_exists: bool = Field(
        default=False, description="answer a live actor of this name instead of 409"
    )


class ReadyBody(BaseModel):
    """Body of `POST /v1/actors/{name}/ready`: the claimed incarnation now serves here."""

    model_config = BODY_CONFIG

    incarnation: WholeNumber = _INCARNATION
    address: str = Field(description="host:port of the actor's worker")
    job: str = Field(description="the job that hosts the actor")


class DeadBody(BaseModel):
    """Body of `POST /v1/actors/{name}/dead`: the incarnation has ended."""

    model_config = BODY_CONFIG

    incarnation: WholeNumber = _INCARNATION


ACTION_BODIES: dict[str, type[BaseModel]] = {
    "claim": ClaimBody,
    "ready": ReadyBody,
    "dead": DeadBody,
}
"""What each actor action's body must hold (the document shows one operation per action)."""


class ActorAnswer(WireRecord):
    """An actor's record (ActorRecord), as the actor routes answer it."""

    name: str
    incarnation: int
    state: Literal["pending", "ready", "dead"]
    term: int
    address: str | None = None
    job: str | None = None
    claimed_at: float | None = None
    created: bool | None = Field(default=None, description="claim only: a new incarnation")


ACTIONS = (
    ("claim", "Claim a named actor (atomic get-or-create)", "a live actor exists"),
    ("ready", "The claimed incarnation serves at address", "stale or not pending"),
    ("dead", "The incarnation has ended", "not the current incarnation"),
)
"""Each action: what it does, and when it is refused (409)."""
NAME = ("name", "path", "the actor's name")
NO_COORDINATOR = Refusal(503, "no_coordinator", "no coordinator")


def _action_docs(routes: object, found: Route) -> list[Route]:
    """One operation per actor action, each with its body."""
    return [
        replace(
            found,
            path=f"{ACTORS_PATH}/{{name}}/{action}",
            summary=text,
            params=(NAME,),
            errors=(
                Refusal(400, "invalid_actor_request", "malformed request"),
                Refusal(409, "conflict", conflict),
                NO_COORDINATOR,
            ),
            body=ACTION_BODIES[action],
            body_optional=action == "claim",
        )
        for action, text, conflict in ACTIONS
    ]


class ActorRegistry:
    """Names to records, for one term. No await runs between a check and its update, so a claim
    is atomic on the coordinator's event loop."""

    def __init__(self) -> None:
        self.term = -1
        self.records: dict[str, ActorRecord] = {}

    def fence(self, term: int) -> None:
        """Forget every record of an older term (a new coordinator starts empty)."""
        if term != self.term:
            self.term = term
            self.records = {}

    def claim(self, name: str, get_if_exists: bool, now: float) -> tuple[ActorRecord, bool]:
        """(record, created): the live record of `name`, or a new pending incarnation."""
        current = self.records.get(name)
        if current is not None and current.live(now):
            if not get_if_exists:
                raise RegistryError(409, "actor_exists", f"an actor named {name!r} exists")
            return current, False
        incarnation = 1 if current is None else current.incarnation + 1
        record = ActorRecord(name, incarnation, "pending", self.term, claimed_at=now)
        self.records[name] = record
        return record, True

    def _current(self, name: str, incarnation: int) -> ActorRecord:
        record = self.records.get(name)
        if record is None or record.incarnation != incarnation:
            found = "none" if record is None else str(record.incarnation)
            raise RegistryError(
                409,
                "stale_incarnation",
                f"actor {name!r} incarnation {incarnation} is not current (current: {found})",
            )
        return record

    def ready(self, name: str, incarnation: int, address: str, job: str) -> ActorRecord:
        record = self._current(name, incarnation)
        if record.state != "pending":
            raise RegistryError(409, "not_pending", f"actor {name!r} is {record.state}")
        updated = replace(record, state="ready", address=address, job=job)
        self.records[name] = updated
        return updated

    def dead(self, name: str, incarnation: int) -> ActorRecord:
        record = replace(self._current(name, incarnation), state="dead")
        self.records[name] = record
        return record

    def lookup(self, name: str) -> ActorRecord:
        record = self.records.get(name)
        if record is None:
            raise RegistryError(404, "no_such_actor", f"no actor is named {name!r}")
        return record


class ActorRoutes:
    """POST /v1/actors/{name}/claim|ready|dead and GET /v1/actors/{name} on every daemon; the
    coordinator answers, the others forward (signed) to it."""

    def __init__(
        self, runtime: NodeRuntime, term: Callable[[], int | None], secret: bytes | None
    ) -> None:
        self.runtime = runtime
        self._term = term
        self._secret = secret
        self.registry = ActorRegistry()
        self._peers: PeerClient | None = None

    async def open(self) -> None:
        return None

    def checks(self) -> Mapping[str, Check]:
        return {}

    def routes(self) -> list[Endpoint]:
        return endpoints(self)

    @route(
        "GET",
        ACTORS_PATH + "/{name}",
        callers=READ,
        answers=((200, "record"),),
        errors=[Refusal(404, "no_such_actor", "no such actor"), NO_COORDINATOR],
        params=(NAME,),
        answer=ActorAnswer,
    )
    async def _get(self, request: web.Request) -> web.Response:
        """The named actor's current incarnation, state and address (from the coordinator)"""
        return await self._handle(request)

    @route(
        "POST",
        ACTORS_PATH + "/{name}/{action}",
        callers=[Caller.PEER, Caller.OPERATOR],
        summary="An actor action: claim, ready or dead",
        answers=((200, "the record (claim: and whether it was created)"),),
        answer=ActorAnswer,
        each=_action_docs,
    )
    async def _post(self, request: web.Request) -> web.Response:
        return await self._handle(request)

    async def close(self) -> None:
        if self._peers is not None:
            await self._peers.close()
            self._peers = None

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            name = request.match_info["name"]
            action = request.match_info.get("action", "get")
            body: BaseModel | None = None
            if request.method == "POST":
                model = ACTION_BODIES.get(action)
                if model is None:
                    raise RegistryError(404, "no_such_action", f"unknown actor action {action!r}")
                body = parse_body(model, await request.read(), optional=True)
            coordinator = self.runtime.coordinator
            term = self._term()
            if coordinator is None or term is None:
                raise RegistryError(503, "no_coordinator", "no coordinator yet; retry shortly")
            if coordinator != self.runtime.node_id:
                forwarded_by = request.headers.get(FORWARDED_HEADER)
                if forwarded_by:
                    raise RegistryError(
                        409,
                        "not_coordinator",
                        f"node {self.runtime.node_id} is not the coordinator (it is "
                        f"{coordinator}), as {forwarded_by} believed; retry shortly",
                    )
                return await self._forward(request, coordinator, body)
            self.registry.fence(term)
            return web.json_response(self._answer(name, action, body))
        except BodyError as exc:
            raise RegistryError(400, "invalid_actor_request", f"{request.path}: {exc}") from None

    def _answer(self, name: str, action: str, body: BaseModel | None) -> dict[str, object]:
        registry = self.registry
        if action == "get":
            return asdict(registry.lookup(name))
        if isinstance(body, ClaimBody):
            record, created = registry.claim(name, body.get_if_exists, time.time())
            if created:
                log.info(
                    "node %s term %d: actor %s incarnation %d claimed",
                    self.runtime.node_id,
                    registry.term,
                    name,
                    record.incarnation,
                )
            return {**asdict(record), "created": created}
        if isinstance(body, ReadyBody):
            return asdict(registry.ready(name, body.incarnation, body.address, body.job))
        if isinstance(body, DeadBody):
            log.info(
                "node %s term %d: actor %s incarnation %d reported dead",
                self.runtime.node_id,
                registry.term,
                name,
                body.incarnation,
            )
            return asdict(registry.dead(name, body.incarnation))
        raise RegistryError(404, "no_such_action", f"unknown actor action {action!r}")

    async def _forward(
        self, request: web.Request, coordinator: str, body: BaseModel | None
    ) -> web.Response:
        members = self.runtime.membership.members() if self.runtime.membership else []
        target = next((m for m in members if m.node_id == coordinator), None)
        if target is None:
            raise RegistryError(503, "unknown_coordinator", f"coordinator {coordinator} unknown")
        if self._peers is None:
            settings = self.runtime.settings
            identity = Identity(self._secret, self.runtime.node_id, settings.cluster_name)
            self._peers = PeerClient(
                identity, timeouts=settings.timeouts, tls=peer_tls(self.runtime)
            )
        try:
            status, answer = await self._peers.call_json(
                request.method,
                f"{target.address}:{target.port}",
                request.path,
                None if body is None else body.model_dump(),
                headers={FORWARDED_HEADER: self.runtime.node_id},
            )
        except PeerRequestError as exc:
            raise RegistryError(
                502, "coordinator_unreachable", f"coordinator {coordinator}: {exc.reason}"
            ) from exc
        return web.json_response(answer, status=status)


def open_actor_routes(runtime: NodeRuntime, coordination: Any, secret: bytes | None) -> ActorRoutes:
    """The actor routes of a daemon whose election is `coordination` (a Coordination)."""

    def term() -> int | None:
        elector = coordination.elector
        return None if elector is None else int(elector.state.term)

    return ActorRoutes(runtime, term, secret)
