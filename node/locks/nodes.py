"""Taking a node out gently: drain and undrain it (kept in the lock table on a majority of the
voters, so a drain survives a coordinator failover; the coordinator plans with it), and make a
node leave (it gossips `left` at once and stops).

Routes: POST /v1/nodes/{node}/drain|undrain (forwarded to the coordinator) and
POST /v1/nodes/{node}/leave (forwarded to that node).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from config.fields import is_valid_node_id
from net import PeerRequestError
from node.audit.entries import NODE_DRAIN, NODE_LEAVE, NODE_UNDRAIN, record_audit
from node.component import Check, Endpoint, paired
from node.election.elector import Elector
from node.election.service import ElectionService
from node.errors import BodyError, LockError
from node.locks.service import FORWARDED_HEADER, LockService, answers_lock_errors
from node.locks.table import LockTable, put_drain
from node.openapi import BODY_CONFIG, RouteDoc, parse_body
from node.plan import RolePlan
from node.runtime import NodeRuntime
from node.security import request_sender

log = logging.getLogger(__name__)

NODES_PATH = "/v1/nodes"
MAX_KILL_AFTER_S = 30 * 86400.0
PLAN_POLL_S = 0.05
ACTIONS = ("drain", "undrain", "leave")

StopFn = Callable[[str], None]
"""Stop this daemon, with the reason (the daemon's own stop request)."""
LeaveFn = Callable[[], Awaitable[None]]
"""Gossip this node's leave (node.membership's `leave`)."""


class DrainBody(BaseModel):
    """POST /v1/nodes/{node}/drain: kill the node's running jobs after `kill_after_s` seconds
    (null: let them finish)."""

    model_config = BODY_CONFIG

    kill_after_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_KILL_AFTER_S,
        description="seconds after which the node's running jobs are killed; null: they finish",
    )


class NodeBody(BaseModel):
    """Body of `POST /v1/nodes/{node}/undrain` and `.../leave` (optional): an empty object."""

    model_config = BODY_CONFIG


NODE_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
    "description": "a node id: 1 to 63 letters, digits, '.', '_' or '-', the first not '.', "
    "'_' or '-'",
}


DRAIN_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["node", "draining", "coordinator", "plan", "applied"],
    "properties": {
        "node": {"type": "string"},
        "draining": {"type": "boolean"},
        "kill_after_s": {"type": ["number", "null"]},
        "coordinator": {"type": "string"},
        "plan": {
            "description": "the fence [term, version] of the first plan with this change",
            "type": ["array", "null"],
            "items": {"type": "integer"},
        },
        "applied": {
            "type": "boolean",
            "description": "the node acknowledged that plan (false: it is not reachable now)",
        },
    },
}
LEAVE_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["node", "leaving"],
    "properties": {"node": {"type": "string"}, "leaving": {"const": True}},
}


def _member(runtime: NodeRuntime, node: str) -> Any:
    """The member `node` of this node's view, or None."""
    membership = runtime.membership
    for member in () if membership is None else membership.members():
        if member.node_id == node:
            return member
    return None


def _node_of(request: web.Request) -> str:
    node = request.match_info["node"]
    if not is_valid_node_id(node):
        raise LockError(400, "invalid_node", f"{node!r} is not a node id")
    return node


async def _empty_body(request: web.Request) -> None:
    try:
        parse_body(NodeBody, await request.read(), optional=True)
    except BodyError as exc:
        raise LockError(400, "invalid_body", exc.reason) from None


class NodeOps:
    """The drain, undrain and leave routes of one node."""

    def __init__(
        self,
        runtime: NodeRuntime,
        locks: LockService,
        elector: Callable[[], Elector | None],
        leave: LeaveFn,
        stop: StopFn,
    ) -> None:
        self.runtime = runtime
        self.locks = locks
        self._elector = elector
        self._leave = leave
        self._stop = stop
        self._leaving: asyncio.Task[None] | None = None

    def attach(self, election: ElectionService) -> None:
        """Plan with the lock table's drains: the coordinator reads them from the table it
        serves, and re-plans whenever they change. Call before the election starts."""
        election.drains = self.locks.drains_for

        def replan() -> None:
            elector = self._elector()
            if elector is not None:
                elector.notify_membership_changed()

        self.locks.drain_listeners.append(replan)

    async def close(self) -> None:
        """Wait for a leave in progress (the daemon stops once it is announced)."""
        if self._leaving is not None:
            await asyncio.gather(self._leaving, return_exceptions=True)

    # HTTP

    async def open(self) -> None:
        return None

    def checks(self) -> Mapping[str, Check]:
        return {}

    def routes(self) -> list[Endpoint]:
        served = [
            web.post(f"{NODES_PATH}/{{node}}/drain", answers_lock_errors(self._handle_drain)),
            web.post(f"{NODES_PATH}/{{node}}/undrain", answers_lock_errors(self._handle_undrain)),
            web.post(f"{NODES_PATH}/{{node}}/leave", answers_lock_errors(self._handle_leave)),
        ]
        return paired(served, self.docs())

    @staticmethod
    def docs() -> list[RouteDoc]:
        node = ("node", "path", "the node's id", NODE_ID_SCHEMA)
        return [
            RouteDoc(
                "POST",
                f"{NODES_PATH}/{{node}}/drain",
                'Drain a node {"kill_after_s"}: no new job, gang member, training rank, weights '
                "place or actor goes there; its running jobs finish (or are killed after "
                "kill_after_s). Kept on a majority of the voters; answered by the coordinator "
                "once a plan carries it",
                (
                    (200, "drained"),
                    (400, "bad request"),
                    (404, "no such member"),
                    (503, "no coordinator or no quorum of voters"),
                ),
                parameters=(node,),
                body=DrainBody,
                body_optional=True,
                response=DRAIN_ANSWER,
            ),
            RouteDoc(
                "POST",
                f"{NODES_PATH}/{{node}}/undrain",
                "Undrain a node: it takes new work again from the next plan",
                (
                    (200, "undrained (or was not drained)"),
                    (400, "bad request"),
                    (503, "no coordinator or no quorum of voters"),
                ),
                parameters=(node,),
                body=NodeBody,
                body_optional=True,
                response=DRAIN_ANSWER,
            ),
            RouteDoc(
                "POST",
                f"{NODES_PATH}/{{node}}/leave",
                "Make a node leave the cluster: it gossips `left` (every peer shows it left "
                "at once, with no suspicion), then its daemon stops",
                (
                    (202, "the node leaves"),
                    (400, "bad request"),
                    (404, "no such alive member"),
                    (503, "the node cannot be reached"),
                ),
                parameters=(node,),
                body=NodeBody,
                body_optional=True,
                response=LEAVE_ANSWER,
            ),
        ]

    async def _handle_drain(self, request: web.Request) -> web.Response:
        node = _node_of(request)
        try:
            body = parse_body(DrainBody, await request.read(), optional=True)
        except BodyError as exc:
            raise LockError(400, "invalid_drain", exc.reason) from None
        if _member(self.runtime, node) is None:
            raise LockError(
                404, "unknown_node", f"no member {node} in this node's view; see: shoal peers"
            )
        record = {
            "kill_after_s": body.kill_after_s,
            "since": time.time(),
            "by": request_sender() or self.runtime.node_id,
        }
        return await self._change(request, node, body.model_dump(), record)

    async def _handle_undrain(self, request: web.Request) -> web.Response:
        node = _node_of(request)
        await _empty_body(request)
        return await self._change(request, node, {}, None)

    async def _change(
        self,
        request: web.Request,
        node: str,
        body: Mapping[str, Any],
        record: Mapping[str, Any] | None,
    ) -> web.Response:
        """Store the change on a majority (at the coordinator), wait for the plan that carries
        it, and record it in the audit trail of the node the operator asked."""
        forwarded = await self.locks.forward(request, dict(body))
        if forwarded is not None:
            response = forwarded
        else:
            response = web.json_response(await self._apply(node, record))
        if response.status == 200 and not request.headers.get(FORWARDED_HEADER):
            answer = json.loads(response.body) if isinstance(response.body, bytes) else {}
            entry_type = NODE_DRAIN if record is not None else NODE_UNDRAIN
            payload = {"name": node, "plan": answer.get("plan"), "applied": answer.get("applied")}
            if record is not None:
                payload["kill_after_s"] = record["kill_after_s"]
            await record_audit(self.runtime.wal, entry_type, payload, self.runtime.node_id)
        return response

    async def _apply(self, node: str, record: Mapping[str, Any] | None) -> dict[str, Any]:
        """At the coordinator: the table with the change on a majority, then the plan."""
        if record is not None:
            # a repeated drain keeps its first `since` and `by` unless kill_after_s changes
            def change(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
                old = table.drains.get(node)
                if old is not None and old.get("kill_after_s") == record["kill_after_s"]:
                    return table, None
                return put_drain(table, term, node, record), None
        else:

            def change(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
                return put_drain(table, term, node, None), None

        await self.locks.apply(change)
        draining = record is not None
        log.info(
            "node %s: %s %s", self.runtime.node_id, "drained" if draining else "undrained", node
        )
        plan, applied = await self._planned(node, draining)
        return {
            "node": node,
            "draining": draining,
            "kill_after_s": None if record is None else record["kill_after_s"],
            "coordinator": self.runtime.node_id,
            "plan": None if plan is None else plan.fence.to_list(),
            "applied": applied,
        }

    async def _planned(self, node: str, draining: bool) -> tuple[RolePlan | None, bool]:
        """The first plan of this coordinator that says `node` drains (or not), and whether
        `node` acknowledged it, within a few plan rounds (at once when `node` has no role in
        it: it is not an alive member)."""
        elector = self._elector()
        if elector is None:
            return None, False
        elector.notify_membership_changed()
        timeouts = self.runtime.settings.timeouts
        deadline = time.monotonic() + 2 * timeouts.lease_s + 2.0
        plan: RolePlan | None = None
        while time.monotonic() < deadline:
            current = elector.plan
            if current is not None and current.is_draining(node) == draining:
                plan = current
                if node == self.runtime.node_id:
                    return plan, True
                if node not in current.roles:
                    return plan, False  # not an alive member: nobody to acknowledge it
                acked = elector.state.peer_fences.get(node)
                if acked is not None and acked >= plan.fence:
                    return plan, True
            await asyncio.sleep(PLAN_POLL_S)
        return plan, False

    async def _handle_leave(self, request: web.Request) -> web.Response:
        node = _node_of(request)
        await _empty_body(request)
        runtime = self.runtime
        if node != runtime.node_id:
            response = await self._forward_leave(request, node)
        else:
            if self._leaving is None:
                self._leaving = asyncio.create_task(self._leave_and_stop(), name="node-leave")
            response = web.json_response({"node": node, "leaving": True}, status=202)
        if not request.headers.get(FORWARDED_HEADER) and response.status == 202:
            await record_audit(runtime.wal, NODE_LEAVE, {"name": node}, runtime.node_id)
        return response

    async def _leave_and_stop(self) -> None:
        try:
            await self._leave()
        except Exception as exc:  # peers detect the stopped node anyway
            log.warning("node %s: announcing the leave failed: %s", self.runtime.node_id, exc)
        self._stop("an operator asked this node to leave the cluster (shoal node leave)")

    async def _forward_leave(self, request: web.Request, node: str) -> web.Response:
        member = _member(self.runtime, node)
        if member is None or str(member.state) != "alive":
            state = "not in this node's view" if member is None else str(member.state)
            raise LockError(404, "unknown_node", f"node {node} is {state}; it cannot leave")
        peers = self.locks.peers
        url = peers.base_url(f"{member.address}:{member.port}")
        headers = {FORWARDED_HEADER: self.runtime.node_id}
        try:
            status, answer = await peers.call_json("POST", url, request.path, {}, headers=headers)
        except PeerRequestError as exc:
            raise LockError(503, "node_unreachable", f"{node}: {exc.reason}") from exc
        return web.json_response(answer, status=status)
