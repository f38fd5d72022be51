"""The HTTP API v1 of a node: health, status, peers, metrics, the OpenAPI document."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiohttp import web

from config import (
    CLOCK_SKEWS,
    HEADER_VERSION,
    PROTOCOL_VERSION,
    protocol_gap,
    protocol_of,
    version_header,
)
from health import CircuitState, HealthStatus
from node.component import Check, Component, Endpoint, endpoints_of, paired, route_docs
from node.identity.roles import CertificateGate
from node.metrics import install_node_metrics
from node.openapi import TEXT, RouteDoc, documented_twice, openapi_document
from node.runtime import NodeRuntime
from node.security import (
    AUTH_POLICY,
    OPENAPI_PATH,
    AuthPolicy,
    auth_middleware,
    error_middleware,
    foreign_cluster_middleware,
)

RUNTIME = web.AppKey("runtime", NodeRuntime)
ROUTE_DOCS: web.AppKey[tuple[RouteDoc, ...]] = web.AppKey("route_docs", tuple)
MAX_BODY_BYTES = 64 * 1024 * 1024

_HEALTH_STATES = [status.value for status in HealthStatus]
HEALTH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["status", "components"],
    "properties": {
        "status": {"enum": _HEALTH_STATES},
        "components": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "status", "message"],
                "properties": {
                    "name": {"type": "string"},
                    "status": {"enum": _HEALTH_STATES},
                    "message": {"type": "string"},
                },
            },
        },
    },
}
_MEMBER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["node_id", "address", "port", "state", "incarnation", "is_self", "meta"],
    "properties": {
        "node_id": {"type": "string"},
        "address": {"type": "string"},
        "port": {"type": "integer"},
        "state": {"type": "string"},
        "incarnation": {"type": "integer"},
        "last_seen_s": {"type": "number"},
        "role": {"type": ["string", "null"]},
        "version": {"type": ["string", "null"]},
        "protocol": {
            "type": "integer",
            "description": "the member's announced protocol; 1 when it announces none",
        },
        "is_self": {"type": "boolean"},
        "refused": {
            "type": ["string", "null"],
            "description": "why this node refuses the member (its certificate was revoked: it"
            " shows dead and is not heard), else null",
        },
        "meta": {"type": "object"},
    },
}
PEERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["members"],
    "properties": {"members": {"type": "array", "items": _MEMBER_SCHEMA}},
}
AUTOSTOP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["enabled", "state"],
    "properties": {
        "enabled": {"type": "boolean"},
        "state": {"enum": ["off", "starting", "idle", "busy", "acting", "acted"]},
        "provider": {"type": "string"},
        "action": {"enum": ["stop", "release"]},
        "dry_run": {"type": "boolean"},
        "window_s": {"type": "number"},
        "check_interval_s": {"type": "number"},
        "gpu_util_threshold": {"type": "number"},
        "idle_since": {"type": ["number", "null"]},
        "idle_for_s": {"type": "number"},
        "busy_reasons": {"type": "array", "items": {"type": "string"}},
        "last_decision": {"type": ["object", "null"]},
        "last_error": {"type": ["string", "null"]},
    },
}
STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "node_id",
        "cluster",
        "version",
        "release",
        "protocol",
        "role",
        "term",
        "members",
        "wal",
        "health",
    ],
    "properties": {
        "node_id": {"type": "string"},
        "cluster": {"type": "string"},
        "version": {"type": "string", "description": "the release (same as `release`)"},
        "release": {"type": "string", "description": "this node's shoal release"},
        "protocol": {
            "type": "integer",
            "description": "this node's wire protocol version (config.PROTOCOL_VERSION)",
        },
        "port": {"type": "integer"},
        "uptime_s": {"type": "number"},
        "role": {"type": ["string", "null"]},
        "term": {"type": ["integer", "null"]},
        "coordinator": {"type": ["string", "null"]},
        "drain": {
            "description": "this node's drain in the plan it applies (shoal node drain), or null",
            "anyOf": [
                {
                    "type": "object",
                    "required": ["kill_after_s"],
                    "properties": {"kill_after_s": {"type": ["number", "null"]}},
                },
                {"type": "null"},
            ],
        },
        "quarantine": {
            "description": "this node's GPU quarantine (docs/fault-tolerance.md#gpu-faults): "
            "the reason (the plan's, or the fault read now), the state (faulty, settling, "
            "selftest, selftest_failed, readmitting, held) and the last self-test, or null",
            "type": ["object", "null"],
        },
        "members": {"type": "object", "additionalProperties": {"type": "integer"}},
        "wal": {"type": "object"},
        "breakers": {"type": "object"},
        "health": {"enum": _HEALTH_STATES},
        "health_problems": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "array", "items": {"type": "string"}},
        "autostop": AUTOSTOP_SCHEMA,
        "training": {
            "description": "this node's training ranks (node.training), or null while none "
            "reports: generation, ranks, their highest step, their median steps/s",
            "type": ["object", "null"],
            "properties": {
                "generation": {"type": "integer"},
                "ranks": {"type": "integer"},
                "step": {"type": "integer"},
                "steps_per_s": {"type": "number"},
            },
        },
    },
}

CORE_DOCS = (
    RouteDoc(
        "GET",
        "/v1/health",
        "Health of this node: healthy, degraded or unhealthy, with every component",
        ((200, "healthy or degraded"), (503, "unhealthy")),
        authenticated=False,
        response=HEALTH_SCHEMA,
    ),
    RouteDoc(
        "GET",
        "/v1/status",
        "This node: identity, role, term, members, WAL, breakers, GPUs",
        response=STATUS_SCHEMA,
    ),
    RouteDoc(
        "GET", "/v1/peers", "The membership view: one object per member", response=PEERS_SCHEMA
    ),
    RouteDoc(
        "GET",
        "/metrics",
        "Prometheus metrics (signature or Authorization: Bearer token)",
        ((200, "the text exposition format"), (503, "metrics not initialised yet")),
        response=TEXT,
        response_type="text/plain",
        bearer=True,
    ),
    RouteDoc(
        "GET",
        OPENAPI_PATH,
        "This document (served without a signature: it holds no secret)",
        authenticated=False,
        response={"type": "object", "required": ["openapi", "paths"]},
    ),
)


async def handle_health(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    if runtime.health is None:
        return web.json_response({"status": HealthStatus.HEALTHY.value, "components": []})
    summary = runtime.health.summary()
    status = 503 if summary.status is HealthStatus.UNHEALTHY else 200
    return web.json_response(summary.to_dict(), status=status)


def _member_dict(member: Any) -> dict[str, Any]:
    meta = dict(member.meta)
    return {
        "node_id": member.node_id,
        "address": member.address,
        "port": member.port,
        "state": str(member.state),
        "incarnation": member.incarnation,
        "last_seen_s": round(member.last_seen_s, 3),
        "role": meta.get("role"),
        "version": meta.get("version"),
        "protocol": protocol_of(meta),
        "is_self": bool(getattr(member, "is_self", False)),
        "refused": getattr(member, "refused", None),
        "meta": meta,
    }


def _protocol_gaps(runtime: NodeRuntime) -> list[str]:
    """A note per member whose announced protocol is more than one step from this node's."""
    members: Sequence[Any] = runtime.membership.members() if runtime.membership else []
    gaps = (protocol_gap(m.node_id, protocol_of(m.meta)) for m in members)
    return [gap for gap in gaps if gap is not None]


def _breakers_document(runtime: NodeRuntime) -> dict[str, Any]:
    """The status document's `breakers`: every breaker not closed, as `peer/transport` and in
    detail."""
    snapshots = [
        snap for snap in runtime.breakers.all_breakers() if snap.state is not CircuitState.CLOSED
    ]
    return {
        "open": [f"{snap.peer}/{snap.transport}" for snap in snapshots],
        "details": [
            {
                "peer": snap.peer,
                "transport": snap.transport,
                "state": snap.state.value,
                "retry_after_s": snap.retry_after_s,
            }
            for snap in snapshots
        ],
    }


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


async def status_document(runtime: NodeRuntime) -> dict[str, Any]:
    """The /v1/status document (also what `shoal status` prints)."""
    runtime.refresh()
    wal: dict[str, Any] = {"pending": None, "oldest_pending_age_s": None}
    if runtime.wal is not None:
        stats = await runtime.wal.stats()
        wal = {"pending": stats.pending, "oldest_pending_age_s": stats.oldest_pending_age_s}
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
        "drain": runtime.drain,
        "quarantine": runtime.quarantine,
        "members": counts,
        "wal": wal,
        "breakers": breakers,
        "health": health,
        "health_problems": problems,
        "gpus": gpus,
        "jobs": runtime.jobs() if runtime.jobs is not None else None,
        "autostop": (
            runtime.autostop()
            if runtime.autostop is not None
            else {"enabled": False, "state": "off"}
        ),
        "training": runtime.training() if runtime.training is not None else None,
        "config_hash": runtime.settings.config_hash(),
        "notes": notes,
    }


async def handle_status(request: web.Request) -> web.Response:
    return web.json_response(await status_document(request.app[RUNTIME]))


async def handle_peers(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    members: Sequence[Any] = runtime.membership.members() if runtime.membership else []
    return web.json_response({"members": [_member_dict(m) for m in members]})


async def handle_metrics(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    if runtime.metrics is None:
        raise web.HTTPServiceUnavailable(reason="metrics are not initialised yet")
    body, content_type = runtime.metrics.render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


async def handle_openapi(request: web.Request) -> web.Response:
    docs: tuple[RouteDoc, ...] = request.app[ROUTE_DOCS]
    signed = request.app[AUTH_POLICY].secret is not None
    return web.json_response(openapi_document(docs, signed=signed))


def _version_header(
    release: str,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An on_response_prepare hook naming this node's release and protocol (HEADER_VERSION) on
    every answer: routes, errors, refusals, streams."""
    value = version_header(release)

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[HEADER_VERSION] = value

    return add


class CoreRoutes:
    """The core routes as a component: health, status, peers, metrics and the OpenAPI
    document (of every route of the app it is served by)."""

    async def open(self) -> None:
        return None

    def routes(self) -> Sequence[Endpoint]:
        served = [
            web.get("/v1/health", handle_health),
            web.get("/v1/status", handle_status),
            web.get("/v1/peers", handle_peers),
            web.get("/metrics", handle_metrics),
            web.get(OPENAPI_PATH, handle_openapi),
        ]
        return paired(served, CORE_DOCS)

    def checks(self) -> Mapping[str, Check]:
        return {}

    async def close(self) -> None:
        return None


def build_app(
    runtime: NodeRuntime,
    policy: AuthPolicy,
    components: Iterable[Component] = (CoreRoutes(),),
    gates: Iterable[Any] = (),
    identity: CertificateGate | None = None,
) -> web.Application:
    """The node's aiohttp application serving the routes of `components` (the core routes by
    default), whose docs are the OpenAPI document it serves; `gates` are middlewares that run
    before the signature check (the dashboard's cookie), after the refusal of requests that
    name another cluster. With `identity` (auth tls or hmac+tls) the client certificate is
    checked before the signature and the role after it. Raises ValueError when two routes
    document one operation."""
    middlewares: list[Any] = [error_middleware, foreign_cluster_middleware]
    if identity is not None:
        middlewares.append(identity.certificate_middleware)
    middlewares += [*gates, auth_middleware]
    if identity is not None:
        middlewares.append(identity.role_middleware)
    http_metrics = install_node_metrics(runtime)
    if http_metrics is not None:
        middlewares.insert(0, http_metrics.middleware())
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[RUNTIME] = runtime
    app[AUTH_POLICY] = policy
    endpoints = endpoints_of(components)
    docs = route_docs(endpoints)
    twice = documented_twice(docs)
    if twice:
        raise ValueError(
            f"routes documented more than once: {', '.join(twice)}; the OpenAPI document keeps "
            "one operation per method and path, so give each route one RouteDoc"
        )
    app[ROUTE_DOCS] = docs
    app.on_response_prepare.append(_version_header(runtime.version))
    app.router.add_routes(endpoints)
    return app
