"""GET /v1/audit: this node's audit trail from its WAL. Read-only: no route changes or deletes
an entry (any other method is answered 405)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from node.audit.entries import KIND_TYPES, LOCK_GRANT, LOCK_RELEASE, read_audit, record_audit
from node.openapi import RouteDoc
from node.runtime import NodeRuntime
from node.security import bad_request

AUDIT_PATH = "/v1/audit"
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

    def routes(self) -> list[web.RouteDef]:
        return [web.get(AUDIT_PATH, self._handle_audit)]

    @staticmethod
    def docs() -> list[RouteDoc]:
        kinds = sorted(KIND_TYPES)
        return [
            RouteDoc(
                "GET",
                AUDIT_PATH,
                "This node's audit trail from its WAL, oldest first: who (the signed sender), "
                "what, on which node, when. Kinds deploy, drain and certificate list "
                "nothing yet. Read-only: other methods answer 405",
                ((200, "a page of entries; next_after pages on"), (400, "bad parameter")),
                parameters=(
                    ("since", "query", "unix seconds: entries at or after", SINCE_SCHEMA),
                    ("kind", "query", "one kind only", {"enum": kinds}),
                    ("after", "query", "entries with a larger id (paging)", AFTER_SCHEMA),
                    ("limit", "query", f"at most this many (1 to {MAX_LIMIT})", LIMIT_SCHEMA),
                ),
                response=AUDIT_ANSWER,
            )
        ]

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


def audited_lock_route(op: str, handler: Handler, runtime: NodeRuntime, relayed: str) -> Handler:
    """`handler` of POST /v1/locks/{name}/{op}, recording each grant and release in the WAL of
    the node the client asked (a request relayed to the coordinator, with the `relayed`
    header, is recorded by the node that relayed it, with the client as sender)."""

    async def handle(request: web.Request) -> web.Response:
        response = await handler(request)
        if op == "renew" or response.status != 200 or request.headers.get(relayed):
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
