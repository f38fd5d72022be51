"""GET /v1/audit: this node's audit trail from its WAL; POST /v1/audit/deploys: `shoal deploy`
appends the deploy of this host. Append-only: no route changes or deletes an entry (any other
method is answered 405)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from node.audit.entries import (
    DEPLOY_CERTIFICATE,
    DEPLOY_HOST,
    KIND_TYPES,
    LOCK_GRANT,
    LOCK_RELEASE,
    read_audit,
    record_audit,
)
from node.component import Endpoint, paired
from node.errors import BodyError
from node.openapi import BODY_CONFIG, RouteDoc, parse_body
from node.runtime import NodeRuntime
from node.security import bad_request

AUDIT_PATH = "/v1/audit"
DEPLOYS_PATH = "/v1/audit/deploys"
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
MAX_SINCE = 1e12
MAX_ID = 2**63 - 1
SINCE_SCHEMA: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": MAX_SINCE}
AFTER_SCHEMA: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_ID}
LIMIT_SCHEMA: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}

AUDIT_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["node", "entries", "next_after"],
    "properties": {
        "node": {"type": "string"},
        "next_after": {"type": ["integer", "null"]},
        "entries": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "at", "node", "kind", "action", "subject", "sender"],
                "properties": {
                    "id": {"type": "integer"},
                    "at": {"type": "number"},
                    "node": {"type": "string"},
                    "kind": {"enum": sorted(KIND_TYPES)},
                    "action": {"type": "string"},
                    "subject": {"type": "string"},
                    "sender": {"type": ["string", "null"]},
                    "outcome": {"type": "string"},
                    "detail": {"type": "object"},
                },
            },
        },
    },
}


class DeployedCertificate(BaseModel):
    """The node certificate a deploy issued for the host (from the operator's CA)."""

    model_config = BODY_CONFIG

    serial: str = Field(min_length=1, max_length=64, description="hex, as `shoal ca list` shows")
    not_after: str = Field(min_length=1, max_length=64, description="ISO 8601 expiry")


class DeployRecordBody(BaseModel):
    """Body of `POST /v1/audit/deploys`: what `shoal deploy` did to this host."""

    model_config = BODY_CONFIG

    host: str = Field(min_length=1, max_length=128, description="the inventory host name")
    status: str = Field(pattern="^(installed|upgraded)$", description="installed or upgraded")
    version: str = Field(min_length=1, max_length=128, description="the shoal version installed")
    fingerprint: str = Field(max_length=128, description="the deploy fingerprint")
    rolling: bool = Field(default=False, description="part of a rolling upgrade")
    duration_s: float = Field(ge=0, le=1e6, description="how long the host took")
    operator: str = Field(default="", max_length=256, description="user@machine that ran it")
    certificate: DeployedCertificate | None = Field(
        default=None, description="the node certificate issued for the host, if any"
    )


def _number(
    request: web.Request, name: str, default: float, bounds: tuple[float, float], whole: bool
) -> float:
    """The query parameter `name` within `bounds` (an integer when `whole`); 400 otherwise."""
    text = request.query.get(name, "")
    if text == "":
        return default
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        kind = "an integer" if whole else "a number"
        raise bad_request(f"{name} must be {kind}, not {text[:40]!r}", param=name) from None
    low, high = bounds
    if not low <= value <= high:  # also NaN and infinities, without converting a huge int
        raise bad_request(f"{name} must be from {low:g} to {high:g}", param=name)
    return value


class AuditRoutes:
    """The audit route of one node."""

    def __init__(self, runtime: NodeRuntime) -> None:
        self._runtime = runtime

    def routes(self) -> list[Endpoint]:
        return paired(
            [
                web.get(AUDIT_PATH, self._handle_audit),
                web.post(DEPLOYS_PATH, self._handle_deploy),
            ],
            self.docs(),
        )

    @staticmethod
    def docs() -> list[RouteDoc]:
        kinds = sorted(KIND_TYPES)
        return [
            RouteDoc(
                "GET",
                AUDIT_PATH,
                "This node's audit trail from its WAL, oldest first: who (the signed sender), "
                "what, on which node, when. Kinds drain and certificate list "
                "nothing yet. Read-only: other methods answer 405",
                ((200, "a page of entries; next_after pages on"), (400, "bad parameter")),
                parameters=(
                    ("since", "query", "unix seconds: entries at or after", SINCE_SCHEMA),
                    ("kind", "query", "one kind only", {"enum": kinds}),
                    ("after", "query", "entries with a larger id (paging)", AFTER_SCHEMA),
                    ("limit", "query", f"at most this many (1 to {MAX_LIMIT})", LIMIT_SCHEMA),
                ),
                response=AUDIT_ANSWER,
            ),
            RouteDoc(
                "POST",
                DEPLOYS_PATH,
                "Append the deploy of this host (and the node certificate it issued) to the "
                "audit trail, with the signed sender; `shoal deploy` calls it once the host "
                "answers. Nothing is changed or deleted",
                ((201, "recorded"), (400, "malformed body"), (503, "the WAL is not open yet")),
                body=DeployRecordBody,
                response={
                    "type": "object",
                    "required": ["recorded"],
                    "properties": {"recorded": {"type": "integer"}},
                },
            ),
        ]

    async def _handle_deploy(self, request: web.Request) -> web.Response:
        try:
            body = parse_body(DeployRecordBody, await request.read())
        except BodyError as exc:
            raise bad_request(str(exc)) from None
        wal = self._runtime.wal
        if wal is None:
            raise web.HTTPServiceUnavailable(reason="the WAL is not open yet")
        node_id = self._runtime.node_id
        deployed = body.model_dump(exclude={"host", "certificate"})
        await record_audit(wal, DEPLOY_HOST, {"name": body.host, **deployed}, node_id)
        recorded = 1
        if body.certificate is not None:
            issued = {"name": body.host, **body.certificate.model_dump()}
            await record_audit(wal, DEPLOY_CERTIFICATE, issued, node_id)
            recorded += 1
        return web.json_response({"recorded": recorded}, status=201)

    async def _handle_audit(self, request: web.Request) -> web.Response:
        kind = request.query.get("kind") or None
        if kind is not None and kind not in KIND_TYPES:
            raise bad_request(f"kind must be one of {', '.join(sorted(KIND_TYPES))}", param="kind")
        since = _number(request, "since", 0.0, (0.0, MAX_SINCE), whole=False)
        after = int(_number(request, "after", 0, (0, MAX_ID), whole=True))
        limit = int(_number(request, "limit", DEFAULT_LIMIT, (1, MAX_LIMIT), whole=True))
        wal = self._runtime.wal
        if wal is None:
            raise web.HTTPServiceUnavailable(reason="the WAL is not open yet")
        node_id = self._runtime.node_id
        entries = await read_audit(
            wal, node_id, kind=kind, since=since, after_id=after, limit=limit
        )
        next_after = entries[-1].id if len(entries) == limit else None
        return web.json_response(
            {
                "node": node_id,
                "entries": [entry.to_json() for entry in entries],
                "next_after": next_after,
            }
        )


Handler = Callable[[web.Request], Awaitable[web.Response]]


def audited_lock_route(op: str, handler: Handler, runtime: NodeRuntime) -> Handler:
    """`handler` of POST /v1/locks/{name}/{op}, recording each grant and release in the WAL of
    the node the client asked and of the coordinator a request relayed there acts on (as the
    sender the operator's proof names, with the node that relayed it: node.forwarding)."""

    async def handle(request: web.Request) -> web.Response:
        response = await handler(request)
        if op == "renew" or response.status != 200:
            return response
        answer = json.loads(response.body) if isinstance(response.body, bytes) else {}
        if op == "acquire" and answer.get("granted"):
            payload = {"name": answer["name"], "holder": answer["holder"], "fence": answer["fence"]}
            await record_audit(runtime.wal, LOCK_GRANT, payload, runtime.node_id)
        elif op == "release":
            payload = {"name": answer["name"], "holder": answer["holder"]}
            await record_audit(runtime.wal, LOCK_RELEASE, payload, runtime.node_id)
        return response

    return handle
