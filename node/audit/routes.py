"""GET /v1/audit: this node's audit trail from its WAL; POST /v1/audit/deploys: `shoal deploy`
appends the deploy of this host. Append-only: no route changes or deletes an entry (any other
method is answered 405)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, Field, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema

from config.declare import READ, Caller, Refusal, route, unset
from node.audit.entries import (
    DEPLOY_CERTIFICATE,
    DEPLOY_HOST,
    KIND_TYPES,
    LOCK_GRANT,
    LOCK_RELEASE,
    read_audit,
    record_audit,
)
from node.errors import BodyError
from node.openapi import BODY_CONFIG, WireRecord, parse_body
from node.runtime import NodeRuntime
from node.security import bad_request

AUDIT_PATH = "/v1/audit"
DEPLOYS_PATH = "/v1/audit/deploys"
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
MAX_SINCE = 1e12
MAX_ID = 2**63 - 1

Kind = Annotated[str, WithJsonSchema({"enum": sorted(KIND_TYPES)})]


class AuditEntryView(WireRecord):
    """One audit entry: who (the signed sender), what, on which node, when."""

    id: int
    at: float
    node: str
    kind: Kind
    action: str
    subject: str
    sender: str | None
    outcome: str | None = None
    detail: dict[str, Any] | None = None


class AuditAnswer(WireRecord):
    """The answer of `GET /v1/audit`: a page of entries; next_after pages on."""

    node: str
    entries: list[AuditEntryView]
    next_after: int | None


class AuditQuery(BaseModel):
    since: Annotated[float, Field(ge=0, le=MAX_SINCE)] | SkipJsonSchema[None] = unset(
        "unix seconds: entries at or after"
    )
    kind: Kind | SkipJsonSchema[None] = unset("one kind only")
    after: Annotated[int, Field(ge=0, le=MAX_ID)] | SkipJsonSchema[None] = unset(
        "entries with a larger id (paging)"
    )
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT)] | SkipJsonSchema[None] = unset(
        f"at most this many (1 to {MAX_LIMIT})"
    )


class Recorded(WireRecord):
    """The answer of `POST /v1/audit/deploys`: how many entries were appended."""

    recorded: int


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
    """The audit routes of one node."""

    def __init__(self, runtime: NodeRuntime) -> None:
        self._runtime = runtime

    @route(
        "POST",
        DEPLOYS_PATH,
        callers=[Caller.OPERATOR],
        answers=((201, "recorded"),),
        errors=[
            Refusal(400, "bad_request", "malformed body"),
            Refusal(503, "unavailable", "the WAL is not open yet"),
        ],
        body=DeployRecordBody,
        answer=Recorded,
    )
    async def _handle_deploy(self, request: web.Request) -> web.Response:
        """Append the deploy of this host (and the node certificate it issued) to the audit
        trail, with the signed sender; `shoal deploy` calls it once the host answers. Nothing
        is changed or deleted"""
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
        return web.json_response(Recorded(recorded=recorded).to_json(), status=201)

    @route(
        "GET",
        AUDIT_PATH,
        callers=READ,
        answers=((200, "a page of entries; next_after pages on"),),
        errors=[Refusal(400, "bad_request", "bad parameter")],
        query=AuditQuery,
        answer=AuditAnswer,
    )
    async def _handle_audit(self, request: web.Request) -> web.Response:
        """This node's audit trail from its WAL, oldest first: who (the signed sender), what,
        on which node, when. Kinds drain and certificate list nothing yet. Read-only: other
        methods answer 405"""
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


async def audit_lock_change(
    op: str, request: web.Request, response: web.Response, runtime: NodeRuntime
) -> None:
    """Record the grant or release `response` answered to POST /v1/locks/{name}/{op} in the WAL
    of the node the client asked and of the coordinator a request relayed there acts on (as the
    sender the operator's proof names, with the node that relayed it: node.forwarding)."""
    if op == "renew" or response.status != 200:
        return
    answer = json.loads(response.body) if isinstance(response.body, bytes) else {}
    if op == "acquire" and answer.get("granted"):
        payload = {"name": answer["name"], "holder": answer["holder"], "fence": answer["fence"]}
        await record_audit(runtime.wal, LOCK_GRANT, payload, runtime.node_id)
    elif op == "release":
        payload = {"name": answer["name"], "holder": answer["holder"]}
        await record_audit(runtime.wal, LOCK_RELEASE, payload, runtime.node_id)
