"""The HTTP API v1 of a node: health, status, peers, metrics, the OpenAPI document."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from config import (
    CLOCK_SKEWS,
    HEADER_VERSION,
    PROTOCOL_VERSION,
    protocol_gap,
    protocol_of,
    version_header,
)
from config.declare import READ, Caller, Refusal, Route, route
from health import CircuitState, HealthStatus
from node.access import DECLARED
from node.component import Component, Endpoint, Served, endpoints_of, route_docs
from node.connections import head_deadline_middleware
from node.fence import FenceSource
from node.identity.roles import AccessRules, CertificateGate
from node.limits import MAX_BODY_BYTES
from node.metrics import HttpMetrics
from node.openapi import TEXT, WireRecord, documented_twice, openapi_document
from node.runtime import DrainView, NodeRuntime, QuarantineView, StatusParts
from node.security import (
    AUTH_POLICY,
    OPENAPI_PATH,
    AuthPolicy,
    auth_middleware,
    error_middleware,
    foreign_cluster_middleware,
)

RUNTIME = web.AppKey("runtime", NodeRuntime)
ROUTE_DOCS: web.AppKey[tuple[Route, ...]] = web.AppKey("route_docs", tuple)


class ComponentView(WireRecord):
    """One health check's component: its status and message."""

    name: str
    status: HealthStatus
    message: str
    last_check: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


class WalJson(TypedDict):
    """The status document's `wal`: pending operations, the oldest one's age (None: no WAL)."""

    pending: int | None
    oldest_pending_age_s: float | None


class BreakerJson(TypedDict):
    """One breaker not closed, in the status document's `breakers`."""

    peer: str
    transport: str
    state: str
    retry_after_s: float | None


class BreakersJson(TypedDict):
    """The status document's `breakers`: every breaker not closed, by name and in detail."""

    open: list[str]
    details: list[BreakerJson]


class HealthAnswer(WireRecord):
    """The answer of `GET /v1/health`: the worst status and every component."""

    status: HealthStatus
    components: list[ComponentView]


class MemberView(WireRecord):
    """One member of the membership view, as `GET /v1/peers` answers it."""

    node_id: str
    address: str
    port: int
    state: str
    incarnation: int
    last_seen_s: float | None = None
    role: str | None = None
    version: str | None = None
    protocol: int = Field(default=1, description="the member's announced protocol; 1 when none")
    is_self: bool
    refused: str | None = Field(
        default=None,
        description="why this node refuses the member (its certificate was revoked: it shows "
        "dead and is not heard), else null",
    )
    meta: dict[str, str | int | float | bool | None]


class PeersAnswer(WireRecord):
    """The answer of `GET /v1/peers`: one object per member."""

    members: list[MemberView]


class AutostopView(WireRecord):
    """The auto-stop of this node (node.providers.autostop)."""

    enabled: bool
    state: Literal["off", "starting", "idle", "busy", "acting", "acted"]
    provider: str | None = None
    action: Literal["stop", "release"] | None = None
    dry_run: bool | None = None
    window_s: float | None = None
    check_interval_s: float | None = None
    gpu_util_threshold: float | None = None
    idle_since: float | None = None
    idle_for_s: float | None = None
    busy_reasons: list[str] = Field(default_factory=list)
    last_decision: dict[str, Any] | None = None
    last_error: str | None = None


class TrainingStatus(WireRecord):
    """This node's training ranks in `GET /v1/status`."""

    generation: int | None = None
    ranks: int | None = None
    step: int | None = None
    steps_per_s: float | None = None


class StatusAnswer(WireRecord):
    """The answer of `GET /v1/status` (what `shoal status` prints)."""

    node_id: str
    cluster: str
    version: str = Field(description="the release (same as `release`)")
    release: str = Field(description="this node's shoal release")
    protocol: int = Field(description="this node's wire protocol version (PROTOCOL_VERSION)")
    port: int | None = None
    uptime_s: float | None = None
    role: str | None
    term: int | None
    coordinator: str | None = None
    drain: DrainView | None = Field(default=None, description="this node's drain, or null")
    quarantine: QuarantineView | None = Field(
        default=None,
        description="this node's GPU quarantine (docs/fault-tolerance.md#gpu-faults): the "
        "reason (the plan's, or the fault read now), the state (faulty, settling, selftest, "
        "selftest_failed, readmitting, held) and the last self-test, or null",
    )
    members: dict[str, int]
    wal: WalJson
    breakers: BreakersJson
    health: HealthStatus
    health_problems: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    autostop: AutostopView | None = None
    training: TrainingStatus | None = Field(
        default=None,
        description="this node's training ranks (node.training), or null while none reports",
    )


class OpenApiAnswer(WireRecord):
    """An OpenAPI 3.1 document."""

    openapi: str
    paths: dict[str, Any]


def _member_view(member: Any) -> MemberView:
    meta = dict(member.meta)
    role, version = meta.get("role"), meta.get("version")
    return MemberView(
        node_id=member.node_id,
        address=member.address,
        port=member.port,
        state=str(member.state),
        incarnation=member.incarnation,
        last_seen_s=round(member.last_seen_s, 3),
        role=None if role is None else str(role),
        version=None if version is None else str(version),
        protocol=protocol_of(meta),
        is_self=bool(getattr(member, "is_self", False)),
        refused=getattr(member, "refused", None),
        meta=meta,
    )


def _protocol_gaps(runtime: NodeRuntime) -> list[str]:
    """A note per member whose announced protocol is more than one step from this node's."""
    members: Sequence[Any] = runtime.membership.members() if runtime.membership else []
    gaps = (protocol_gap(m.node_id, protocol_of(m.meta)) for m in members)
    return [gap for gap in gaps if gap is not None]


def _breakers_document(runtime: NodeRuntime) -> BreakersJson:
    """The status document's `breakers`: every breaker not closed, as `peer/transport` and in
    detail."""
    snapshots = [
        snap for snap in runtime.breakers.all_breakers() if snap.state is not CircuitState.CLOSED
    ]
    return BreakersJson(
        open=[f"{snap.peer}/{snap.transport}" for snap in snapshots],
        details=[
            BreakerJson(
                peer=snap.peer,
                transport=snap.transport,
                state=snap.state.value,
                retry_after_s=snap.retry_after_s,
            )
            for snap in snapshots
        ],
    )


NO_STATUS_PARTS = StatusParts()
"""A status document without the parts of jobs, auto-stop and training."""


def _health_of(runtime: NodeRuntime) -> tuple[str, list[str]]:
    """The status document's `health` and `health_problems` (the degraded and unhealthy
    components)."""
    summary = runtime.health.summary() if runtime.health is not None else None
    health = summary.status.value if summary is not None else "healthy"
    problems = [
        f"{component.name}: {component.message}"
        for component in (summary.components if summary is not None else ())
        if component.status in (HealthStatus.DEGRADED, HealthStatus.UNHEALTHY)
    ]
    return health, problems


async def status_document(
    runtime: NodeRuntime, parts: StatusParts = NO_STATUS_PARTS
) -> dict[str, Any]:
    """The /v1/status document (also what `shoal status` prints)."""
    runtime.refresh()
    wal = WalJson(pending=None, oldest_pending_age_s=None)
    if runtime.wal is not None:
        stats = await runtime.wal.stats()
        wal = WalJson(pending=stats.pending, oldest_pending_age_s=stats.oldest_pending_age_s)
    breakers = _breakers_document(runtime)
    counts = {"alive": 0, "suspect": 0, "dead": 0, "left": 0}
    if runtime.membership is not None:
        counts.update(runtime.membership.counts())
    health, problems = _health_of(runtime)
    notes = [*runtime.notes, *CLOCK_SKEWS.lines(time.time()), *_protocol_gaps(runtime)]
    try:
        gpus = runtime.gpus()
    except Exception as exc:  # a failing driver shows in the note and the gpu check, not a 500
        gpus = []
        notes.append(f"GPUs cannot be read: {exc}")
    return {
        "node_id": runtime.node_id,
        "cluster": runtime.settings.cluster_name,
        "version": runtime.version,
        "release": runtime.version,
        "protocol": PROTOCOL_VERSION,
        "address": runtime.address,
        "port": runtime.port or runtime.settings.port,
        "started_at": runtime.started_at,
        "uptime_s": round(runtime.uptime_s, 3),
        "role": runtime.role,
        "term": runtime.term,
        "coordinator": runtime.coordinator,
        "plan_version": runtime.plan_version,
        "drain": None if runtime.drain is None else runtime.drain.to_json(),
        "quarantine": None if runtime.quarantine is None else runtime.quarantine.to_json(),
        "members": counts,
        "wal": wal,
        "breakers": breakers,
        "health": health,
        "health_problems": problems,
        "gpus": gpus,
        "jobs": parts.jobs() if parts.jobs is not None else None,
        "autostop": (
            parts.autostop() if parts.autostop is not None else {"enabled": False, "state": "off"}
        ),
        "training": parts.training() if parts.training is not None else None,
        "config_hash": runtime.settings.config_hash(),
        "notes": notes,
    }


def _version_header(
    release: str,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An on_response_prepare hook naming this node's release and protocol (HEADER_VERSION) on
    every answer: routes, errors, refusals, streams."""
    value = version_header(release)

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[HEADER_VERSION] = value

    return add


class CoreRoutes(Served):
    """The core routes as a component: health, status, peers, metrics and the OpenAPI
    document (of every route of the app it is served by). `parts`: the status document's parts
    other components own."""

    def __init__(self, parts: StatusParts = NO_STATUS_PARTS) -> None:
        self.parts = parts
        super().__init__(self)

    @route(
        "GET",
        "/v1/health",
        callers=[Caller.PUBLIC],
        answers=((200, "healthy or degraded"),),
        errors=[Refusal(503, "unavailable", "unhealthy")],
        answer=HealthAnswer,
    )
    async def health(self, request: web.Request) -> web.Response:
        """Health of this node: healthy, degraded or unhealthy, with every component"""
        runtime = request.app[RUNTIME]
        if runtime.health is None:
            return web.json_response({"status": HealthStatus.HEALTHY.value, "components": []})
        summary = runtime.health.summary()
        status = 503 if summary.status is HealthStatus.UNHEALTHY else 200
        return web.json_response(summary.to_dict(), status=status)

    @route("GET", "/v1/status", callers=READ, answer=StatusAnswer)
    async def status(self, request: web.Request) -> web.Response:
        """This node: identity, role, term, members, WAL, breakers, GPUs"""
        return web.json_response(await status_document(request.app[RUNTIME], self.parts))

    @route("GET", "/v1/peers", callers=READ, answer=PeersAnswer)
    async def peers(self, request: web.Request) -> web.Response:
        """The membership view: one object per member"""
        runtime = request.app[RUNTIME]
        members: Sequence[Any] = runtime.membership.members() if runtime.membership else []
        return web.json_response({"members": [_member_view(m).to_json() for m in members]})

    @route(
        "GET",
        "/metrics",
        callers=READ,
        answers=((200, "the text exposition format"),),
        errors=[Refusal(503, "unavailable", "metrics not initialised yet")],
        answer=TEXT,
        answer_type="text/plain",
        bearer=True,
    )
    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus metrics (signature or Authorization: Bearer token)"""
        runtime = request.app[RUNTIME]
        if runtime.metrics is None:
            raise web.HTTPServiceUnavailable(reason="metrics are not initialised yet")
        body, content_type = runtime.metrics.render()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    @route("GET", OPENAPI_PATH, callers=[Caller.PUBLIC], answer=OpenApiAnswer)
    async def openapi(self, request: web.Request) -> web.Response:
        """This document (served without a signature: it holds no secret)"""
        routes = request.app[ROUTE_DOCS]
        signed = request.app[AUTH_POLICY].secret is not None
        tls = request.app[TLS_CLIENTS]
        return web.json_response(openapi_document(routes, signed=signed, tls=tls))


TLS_CLIENTS = web.AppKey("tls_clients", bool)
"""Whether the app takes client certificates (its OpenAPI document lists their roles)."""


def _declarations(served: Sequence[Endpoint]) -> dict[tuple[str, str], Route]:
    """Every route's declaration by (method, template)."""
    return {(found.route.method, found.route.path): found.route for found in served}


def _undeclared(app: web.Application, declared: Mapping[tuple[str, str], Route]) -> list[str]:
    """`METHOD path` of every route of `app` without a declaration (HEAD of a GET has its)."""
    bare = []
    for found in app.router.routes():
        method = "GET" if found.method == "HEAD" else found.method
        path = found.resource.canonical if found.resource is not None else "?"
        if (method, path) not in declared:
            bare.append(f"{found.method} {path}")
    return bare


def build_app(
    runtime: NodeRuntime,
    policy: AuthPolicy,
    components: Iterable[Component] = (CoreRoutes(),),
    gates: Iterable[Any] = (),
    identity: CertificateGate | None = None,
    fence: FenceSource | None = None,
    http_metrics: HttpMetrics | None = None,
) -> web.Application:
    """The node's aiohttp application serving the declared routes of `components` (the core
    routes by default); its router, its OpenAPI document and its access rules (node.identity's
    AccessRules: deny by default) are all built from their declarations. `gates` are
    middlewares that run before the signature check (the dashboard's cookie), after the
    refusal of requests that name another cluster. With `identity` (auth tls or hmac+tls) the
    client certificate is checked before the signature. `fence` is the plan this node applies
    (a `fenced` route's check; default the identity's). `http_metrics` observe every request
    (node.metrics.served_metrics). Raises ValueError naming a route
    without a declaration, or documented twice."""
    fence = fence if fence is not None or identity is None else identity.fence
    registry = runtime.metrics.registry if runtime.metrics is not None else None
    rules = AccessRules(fence, registry, open_api=policy.secret is None and identity is None)
    middlewares: list[Any] = [
        head_deadline_middleware,
        error_middleware,
        foreign_cluster_middleware,
    ]
    if identity is not None:
        middlewares.append(identity.certificate_middleware)
    middlewares += [*gates, auth_middleware, rules.middleware]
    if http_metrics is not None:
        middlewares.insert(0, http_metrics.middleware())
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[RUNTIME] = runtime
    app[AUTH_POLICY] = policy
    app[TLS_CLIENTS] = identity is not None
    served = endpoints_of(components)
    docs = route_docs(served)
    routed = documented_twice(found.route for found in served)
    twice = sorted({*routed, *documented_twice(docs)})
    if twice:
        raise ValueError(
            f"routes declared more than once: {', '.join(twice)}; the router and the OpenAPI "
            "document keep one operation per method and path"
        )
    app[ROUTE_DOCS] = docs
    openapi_document(docs)  # a declaration the document cannot show stops the start here
    declared = _declarations(served)
    app[DECLARED] = declared
    app.on_response_prepare.append(_version_header(runtime.version))
    app.router.add_routes(served)
    bare = _undeclared(app, declared)
    if bare:
        raise ValueError(f"routes without a declaration: {', '.join(bare)}; declare each")
    return app
