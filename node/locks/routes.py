"""The lock routes (POST /v1/locks/{name}/acquire|renew|release, GET /v1/locks, the voters'
POST /v1/lockstore/prepare|accept) and the node routes (POST /v1/nodes/{node}/drain|undrain,
forwarded to the coordinator, and POST /v1/nodes/{node}/leave, forwarded to that node), each
declared on its handler: they read the request, call LockService and NodeOps, and answer JSON.
A LockError is answered by the node's error middleware (503 with `Retry-After: 1`).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel

from config.declare import READ, Caller, Refusal, route
from config.fields import is_valid_node_id
from node.access import FORWARDED_HEADER
from node.audit.entries import NODE_DRAIN, NODE_LEAVE, NODE_UNDRAIN, record_audit
from node.audit.routes import audit_lock_change
from node.errors import BodyError, LockError
from node.forwarding import forward_headers
from node.locks.nodes import NodeOps, member_of
from node.locks.service import LockService
from node.locks.table import LOCK_ANSWER, LockFence, LockTable
from node.locks.wire import (
    ACCEPT_PATH,
    LOCK_BODIES,
    LOCKS_PATH,
    MAX_HOLDER_CHARS,
    NAME_PARAMETER,
    NODE_PARAMETER,
    NODES_PATH,
    PREPARE_PATH,
    AcceptBody,
    AcquireBody,
    DrainAnswer,
    DrainBody,
    HolderBody,
    LeaveAnswer,
    LockView,
    NodeBody,
    PrepareBody,
    Promise,
    Released,
    Stored,
)
from node.openapi import parse_body
from node.security import request_sender

B = TypeVar("B", bound=BaseModel)
USERS = (Caller.PEER, Caller.OPERATOR)
"""Who takes locks: an operator's commands and programs, and nodes (a run's coordinator)."""
NO_QUORUM = Refusal(503, "no_lock_quorum", "no coordinator or no quorum of voters")
HOLDER_ERRORS = (
    Refusal(400, "invalid_lock_request", "bad request"),
    Refusal(409, "not_holder", "not the holder, or a stale fence"),
    NO_QUORUM,
)
VOTER_ERRORS = (
    Refusal(400, "invalid_lock_request", "bad request"),
    Refusal(409, "stale_term", "a newer term was promised"),
)
NODE_ERRORS = (Refusal(400, "invalid_node", "bad request"),)


async def forward_to_coordinator(
    locks: LockService, request: web.Request, body: Any
) -> web.Response | None:
    """None when this node serves `request` (it coordinates); otherwise the coordinator's
    answer to it: the request's own bytes, path and query, with the operator's proof
    (node.forwarding), so the coordinator acts and audits as the operator who asked."""
    forwarded = bool(request.headers.get(FORWARDED_HEADER))
    if locks.is_coordinator():
        return None
    proof = forward_headers(request, locks.runtime.node_id)
    answer = await locks.call_coordinator(
        request.method, request.raw_path, body, forwarded=forwarded, raw=await request.read(),
        proof=proof,
    )  # fmt: skip
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


class LockRoutes:
    """GET /v1/locks, POST /v1/locks/{name}/acquire|renew|release (each grant and release
    audited) and the voters' POST /v1/lockstore/prepare|accept."""

    def __init__(self, locks: LockService) -> None:
        self.locks = locks

    @route(
        "GET",
        LOCKS_PATH,
        callers=READ,
        answers=((200, "the lock table"),),
        errors=[NO_QUORUM],
        answer=LockView,
    )
    async def listing(self, request: web.Request) -> web.Response:
        """The cluster's locks (from the coordinator): holders, fences, leases, waiters"""
        locks = self.locks
        forwarded = await forward_to_coordinator(locks, request, None)
        if forwarded is not None:
            return forwarded
        table = await locks.current()
        view = LockView(
            coordinator=locks.runtime.node_id,
            version=table.version,
            locks=dict(table.locks),
            runs=dict(table.runs),
            drains=dict(table.drains),
            quarantines=dict(table.quarantines),
        )
        return web.json_response(view.to_json())

    @route(
        "POST",
        f"{LOCKS_PATH}/{{name}}/acquire",
        callers=USERS,
        answers=((200, "granted or queued"),),
        errors=HOLDER_ERRORS,
        params=(NAME_PARAMETER,),
        body=AcquireBody,
        answer=LOCK_ANSWER.json_schema(),
    )
    async def acquire(self, request: web.Request) -> web.Response:
        """Acquire {"holder", "ttl_s", "wait", "wait_s"}: granted with a fence [term, seq], or
        the position in the FIFO queue"""
        return await self._audited("acquire", request)

    @route(
        "POST",
        f"{LOCKS_PATH}/{{name}}/renew",
        callers=USERS,
        answers=((200, "renewed"),),
        errors=HOLDER_ERRORS,
        params=(NAME_PARAMETER,),
        body=HolderBody,
        answer=LOCK_ANSWER.json_schema(),
    )
    async def renew(self, request: web.Request) -> web.Response:
        """Renew the holder's lease {"holder", "fence"}; 409 when the lock was lost"""
        return await _operation(self.locks, "renew", request)

    @route(
        "POST",
        f"{LOCKS_PATH}/{{name}}/release",
        callers=USERS,
        answers=((200, "released"),),
        errors=HOLDER_ERRORS,
        params=(NAME_PARAMETER,),
        body=HolderBody,
        answer=Released,
    )
    async def release(self, request: web.Request) -> web.Response:
        """Release {"holder", "fence"}; the first waiter gets the lock"""
        return await self._audited("release", request)

    async def _audited(self, op: str, request: web.Request) -> web.Response:
        response = await _operation(self.locks, op, request)
        await audit_lock_change(op, request, response, self.locks.runtime)
        return response

    @route(
        "POST",
        PREPARE_PATH,
        callers=[Caller.PEER],
        answers=((200, "the table"),),
        errors=VOTER_ERRORS,
        body=PrepareBody,
        answer=Promise,
    )
    async def prepare(self, request: web.Request) -> web.Response:
        """Voters only: promise term {"term"} and answer the stored lock table"""
        body = checked_body(PrepareBody, await request.read())
        table = await self.locks.prepare(body.term)
        promise = Promise(promised=self.locks.acceptor.promised, table=table.ordered())
        return web.json_response(promise.to_json())

    @route(
        "POST",
        ACCEPT_PATH,
        callers=[Caller.PEER],
        answers=((200, "stored"),),
        errors=VOTER_ERRORS,
        body=AcceptBody,
        answer=Stored,
    )
    async def accept(self, request: web.Request) -> web.Response:
        """Voters only: store a lock table {"term", "table"} of the coordinator"""
        body = checked_body(AcceptBody, await request.read())
        table = LockTable.from_dict(body.table)
        await self.locks.accept(body.term, table)
        return web.json_response(Stored(stored=table.version).to_json())


async def _operation(locks: LockService, op: str, request: web.Request) -> web.Response:
    """POST /v1/locks/{name}/{op}: at the coordinator, or forwarded to it."""
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


# the node routes


class NodeRoutes:
    """POST /v1/nodes/{node}/drain|undrain (at the coordinator, or forwarded to it) and
    POST /v1/nodes/{node}/leave (at that node, or forwarded to it): an operator's, which a
    node relays; each change is recorded in the audit trail of the node the operator asked."""

    def __init__(self, ops: NodeOps) -> None:
        self.ops = ops

    @route(
        "POST",
        f"{NODES_PATH}/{{node}}/drain",
        callers=[Caller.OPERATOR],
        forwarded=True,
        answers=((200, "drained"),),
        errors=[
            Refusal(400, "invalid_drain", "bad request"),
            Refusal(404, "unknown_node", "no such member"),
            NO_QUORUM,
        ],
        params=(NODE_PARAMETER,),
        body=DrainBody,
        body_optional=True,
        answer=DrainAnswer,
    )
    async def drain(self, request: web.Request) -> web.Response:
        """Drain a node {"kill_after_s"}: no new job, gang member, training rank, weights place
        or actor goes there; its running jobs finish (or are killed after kill_after_s). Kept
        on a majority of the voters; answered by the coordinator once a plan carries it"""
        ops, runtime = self.ops, self.ops.runtime
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
            response = web.json_response((await ops.drain(node, body.kill_after_s, by)).to_json())
        await _audit_change(ops, request, response, node, (body.kill_after_s,))
        return response

    @route(
        "POST",
        f"{NODES_PATH}/{{node}}/undrain",
        callers=[Caller.OPERATOR],
        forwarded=True,
        answers=((200, "undrained (or was not drained)"),),
        errors=[*NODE_ERRORS, NO_QUORUM],
        params=(NODE_PARAMETER,),
        body=NodeBody,
        body_optional=True,
        answer=DrainAnswer,
    )
    async def undrain(self, request: web.Request) -> web.Response:
        """Undrain a node: it takes new work again from the next plan; also lifts its GPU
        quarantine (held or not)"""
        ops = self.ops
        node = node_of(request)
        await empty_body(request)
        forwarded = await forward_to_coordinator(ops.locks, request, {})
        if forwarded is not None:
            response = forwarded
        else:
            response = web.json_response((await ops.undrain(node)).to_json())
        await _audit_change(ops, request, response, node, None)
        return response

    @route(
        "POST",
        f"{NODES_PATH}/{{node}}/leave",
        callers=[Caller.OPERATOR],
        forwarded=True,
        answers=((202, "the node leaves"),),
        errors=[
            *NODE_ERRORS,
            Refusal(404, "unknown_node", "no such alive member"),
            Refusal(503, "node_unreachable", "the node cannot be reached"),
        ],
        params=(NODE_PARAMETER,),
        body=NodeBody,
        body_optional=True,
        answer=LeaveAnswer,
    )
    async def leave(self, request: web.Request) -> web.Response:
        """Make a node leave the cluster: it gossips `left` (every peer shows it left at once,
        with no suspicion), then its daemon stops"""
        ops, runtime = self.ops, self.ops.runtime
        node = node_of(request)
        await empty_body(request)
        if node != runtime.node_id:
            proof = forward_headers(request, runtime.node_id)
            raw = await request.read()
            status, answer = await ops.ask_to_leave(node, request.raw_path, proof, raw)
            response = web.json_response(answer, status=status)
        else:
            ops.leave()
            response = web.json_response(LeaveAnswer(node=node).to_json(), status=202)
        if response.status == 202:  # where asked, and at the node that leaves (as the operator)
            await record_audit(runtime.wal, NODE_LEAVE, {"name": node}, runtime.node_id)
        return response


async def _audit_change(
    ops: NodeOps,
    request: web.Request,
    response: web.Response,
    node: str,
    drain: tuple[float | None] | None,
) -> None:
    """Record a drain (`drain` holds its kill_after_s) or an undrain (None) that succeeded, in
    the audit trail of the node the operator asked and of the coordinator it forwarded to
    (which records the operator its proof names, and the node that forwarded it)."""
    if response.status != 200:
        return
    answer = json.loads(response.body) if isinstance(response.body, bytes) else {}
    entry_type = NODE_DRAIN if drain is not None else NODE_UNDRAIN
    payload = {"name": node, "plan": answer.get("plan"), "applied": answer.get("applied")}
    if drain is not None:
        payload["kill_after_s"] = drain[0]
    await record_audit(ops.runtime.wal, entry_type, payload, ops.runtime.node_id)
