"""The lock routes (POST /v1/locks/{name}/acquire|renew|release, GET /v1/locks, the voters'
POST /v1/lockstore/prepare|accept) and the node routes (POST /v1/nodes/{node}/drain|undrain,
forwarded to the coordinator, and POST /v1/nodes/{node}/leave, forwarded to that node): they
read the request, call LockService and NodeOps, and answer JSON. Their docs are
node.locks.docs; node.locks.component pairs the two.

Every error answers LockError's `{"error": CODE, "reason": TEXT, "status": N}` (503 with
`Retry-After: 1`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel

from config.fields import is_valid_node_id
from node.audit.entries import NODE_DRAIN, NODE_LEAVE, NODE_UNDRAIN, record_audit
from node.audit.routes import audited_lock_route
from node.errors import BodyError, LockError
from node.locks.docs import (
    ACCEPT_PATH,
    LOCK_BODIES,
    LOCKS_PATH,
    MAX_HOLDER_CHARS,
    NODES_PATH,
    PREPARE_PATH,
    AcceptBody,
    AcquireBody,
    DrainBody,
    HolderBody,
    LockView,
    NodeBody,
    PrepareBody,
    Promise,
    Released,
    Stored,
)
from node.locks.nodes import NodeOps, member_of
from node.locks.service import FORWARDED_HEADER, LockService
from node.locks.table import LockFence, LockTable
from node.openapi import parse_body
from node.security import request_sender

OPERATIONS = ("acquire", "renew", "release")

Handler = Callable[[web.Request], Awaitable[web.Response]]
B = TypeVar("B", bound=BaseModel)


def answers_lock_errors(handler: Handler) -> Handler:
    """Turn a LockError into its JSON answer (503 with `Retry-After: 1`)."""

    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except LockError as exc:
            headers = {"Retry-After": "1"} if exc.status == 503 else None
            return web.json_response(exc.to_dict(), status=exc.status, headers=headers)

    return wrapped


async def forward_to_coordinator(
    locks: LockService, request: web.Request, body: Any
) -> web.Response | None:
    """None when this node serves `request` (it coordinates); otherwise the coordinator's
    answer to it, with `body` (LockService.call_coordinator)."""
    forwarded = bool(request.headers.get(FORWARDED_HEADER))
    answer = await locks.call_coordinator(request.method, request.path, body, forwarded=forwarded)
    if answer is None:
        return None
    status, data = answer
    return web.json_response(data, status=status)


# request parsing


def parse_lock_body(raw: bytes, operation: str) -> AcquireBody | HolderBody:
    """The body of an acquire/renew/release, checked by its model; LockError 400 naming the
    bad field."""
    return checked_body(LOCK_BODIES[operation], raw)


def checked_body(model: type[B], raw: bytes) -> B:
    try:
        return parse_body(model, raw)
    except BodyError as exc:
        raise LockError(400, "invalid_lock_request", exc.reason) from None


def lock_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not name or len(name) > MAX_HOLDER_CHARS:
        raise LockError(400, "invalid_lock_name", "a lock name of 1 to 200 characters")
    return name


def node_of(request: web.Request) -> str:
    node = request.match_info["node"]
    if not is_valid_node_id(node):
        raise LockError(400, "invalid_node", f"{node!r} is not a node id")
    return node


async def empty_body(request: web.Request) -> None:
    try:
        parse_body(NodeBody, await request.read(), optional=True)
    except BodyError as exc:
        raise LockError(400, "invalid_body", exc.reason) from None


# the lock routes


def lock_routes(locks: LockService) -> list[web.RouteDef]:
    """GET /v1/locks, POST /v1/locks/{name}/acquire|renew|release (each grant and release
    audited) and the voters' POST /v1/lockstore/prepare|accept."""

    async def listing(request: web.Request) -> web.Response:
        forwarded = await forward_to_coordinator(locks, request, None)
        if forwarded is not None:
            return forwarded
        table = await locks.current()
        view = LockView(
            coordinator=locks.runtime.node_id,
            version=table.version,
            locks=dict(table.locks),
            runs={run_id: dict(record) for run_id, record in table.runs.items()},
            drains={node: dict(record) for node, record in table.drains.items()},
            quarantines=dict(table.quarantines),
        )
        return web.json_response(view.to_json())

    async def prepare(request: web.Request) -> web.Response:
        body = checked_body(PrepareBody, await request.read())
        table = await locks.prepare(body.term)
        promise = Promise(promised=locks.acceptor.promised, table=table.ordered())
        return web.json_response(promise.to_json())

    async def accept(request: web.Request) -> web.Response:
        body = checked_body(AcceptBody, await request.read())
        table = LockTable.from_dict(body.table)
        await locks.accept(body.term, table)
        return web.json_response(Stored(stored=table.version).to_json())

    def operation(op: str) -> Handler:
        handler = answers_lock_errors(_operation(locks, op))
        return audited_lock_route(op, handler, locks.runtime, FORWARDED_HEADER)

    return [
        web.get(LOCKS_PATH, answers_lock_errors(listing)),
        *(web.post(f"{LOCKS_PATH}/{{name}}/{op}", operation(op)) for op in OPERATIONS),
        web.post(PREPARE_PATH, answers_lock_errors(prepare)),
        web.post(ACCEPT_PATH, answers_lock_errors(accept)),
    ]


def _operation(locks: LockService, op: str) -> Handler:
    """POST /v1/locks/{name}/{op}: at the coordinator, or forwarded to it."""

    async def handle(request: web.Request) -> web.Response:
        name = lock_name(request)
        fields = parse_lock_body(await request.read(), op)
        forwarded = await forward_to_coordinator(locks, request, fields.model_dump())
        if forwarded is not None:
            return forwarded
        holder = fields.holder
        if isinstance(fields, AcquireBody):
            answer = await locks.acquire(name, holder, fields.ttl_s, fields.wait, fields.wait_s)
            return web.json_response(answer.to_dict())
        fence = None if fields.fence is None else LockFence.parse(fields.fence)
        if op == "renew":
            renewed = await locks.renew(name, holder, fence)
            return web.json_response(renewed.to_dict())
        await locks.release(name, holder, fence)
        return web.json_response(Released(name=name, holder=holder).to_json())

    return handle


# the node routes


def node_routes(ops: NodeOps) -> list[web.RouteDef]:
    """POST /v1/nodes/{node}/drain|undrain (at the coordinator, or forwarded to it) and
    POST /v1/nodes/{node}/leave (at that node, or forwarded to it); each change is recorded in
    the audit trail of the node the operator asked."""
    runtime = ops.runtime

    async def drain(request: web.Request) -> web.Response:
        node = node_of(request)
        try:
            body = parse_body(DrainBody, await request.read(), optional=True)
        except BodyError as exc:
            raise LockError(400, "invalid_drain", exc.reason) from None
        if member_of(runtime, node) is None:
            raise LockError(
                404, "unknown_node", f"no member {node} in this node's view; see: shoal peers"
            )
        by = request_sender() or runtime.node_id
        forwarded = await forward_to_coordinator(ops.locks, request, body.model_dump())
        if forwarded is not None:
            response = forwarded
        else:
            response = web.json_response(await ops.drain(node, body.kill_after_s, by))
        await _audit_change(ops, request, response, node, {"kill_after_s": body.kill_after_s})
        return response

    async def undrain(request: web.Request) -> web.Response:
        node = node_of(request)
        await empty_body(request)
        forwarded = await forward_to_coordinator(ops.locks, request, {})
        if forwarded is not None:
            response = forwarded
        else:
            response = web.json_response(await ops.undrain(node))
        await _audit_change(ops, request, response, node, None)
        return response

    async def leave(request: web.Request) -> web.Response:
        node = node_of(request)
        await empty_body(request)
        if node != runtime.node_id:
            status, answer = await ops.ask_to_leave(node, request.path)
            response = web.json_response(answer, status=status)
        else:
            ops.leave()
            response = web.json_response({"node": node, "leaving": True}, status=202)
        if not request.headers.get(FORWARDED_HEADER) and response.status == 202:
            await record_audit(runtime.wal, NODE_LEAVE, {"name": node}, runtime.node_id)
        return response

    return [
        web.post(f"{NODES_PATH}/{{node}}/drain", answers_lock_errors(drain)),
        web.post(f"{NODES_PATH}/{{node}}/undrain", answers_lock_errors(undrain)),
        web.post(f"{NODES_PATH}/{{node}}/leave", answers_lock_errors(leave)),
    ]


async def _audit_change(
    ops: NodeOps,
    request: web.Request,
    response: web.Response,
    node: str,
    drain: Mapping[str, Any] | None,
) -> None:
    """Record a drain (`drain` holds its kill_after_s) or an undrain (None) that succeeded, in
    the audit trail of the node the operator asked (not of the coordinator it forwarded to)."""
    if response.status != 200 or request.headers.get(FORWARDED_HEADER):
        return
    answer = json.loads(response.body) if isinstance(response.body, bytes) else {}
    entry_type = NODE_DRAIN if drain is not None else NODE_UNDRAIN
    payload = {"name": node, "plan": answer.get("plan"), "applied": answer.get("applied")}
    if drain is not None:
        payload["kill_after_s"] = drain["kill_after_s"]
    await record_audit(ops.runtime.wal, entry_type, payload, ops.runtime.node_id)
