"""Taking a node out gently: drain and undrain it (kept in the lock table on a majority of the
voters, so a drain survives a coordinator failover; the coordinator plans with it), and make a
node leave (it gossips `left` at once and stops). The routes that call these are
node.locks.routes (POST /v1/nodes/{node}/drain|undrain|leave).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from net import PeerRequestError
from node.access import FORWARDED_HEADER
from node.election.elector import Elector
from node.election.service import ElectionService
from node.errors import LockError
from node.locks.quarantines import lift
from node.locks.service import LockService
from node.locks.table import Drain, LockTable, put_drain
from node.locks.wire import DrainAnswer
from node.plan import RolePlan
from node.runtime import NodeRuntime

log = logging.getLogger(__name__)

PLAN_POLL_S = 0.05

StopFn = Callable[[str], None]
"""Stop this daemon, with the reason (the daemon's own stop request)."""
LeaveFn = Callable[[], Awaitable[None]]
"""Gossip this node's leave (node.membership's `leave`)."""


def member_of(runtime: NodeRuntime, node: str) -> Any:
    """The member `node` of this node's view, or None."""
    membership = runtime.membership
    for member in () if membership is None else membership.members():
        if member.node_id == node:
            return member
    return None


class NodeOps:
    """Drain, undrain and leave, as one node does them."""

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
        """Plan with the lock table's drains and GPU quarantines: the coordinator reads them
        from the table it serves, and re-plans whenever they change. Call before the election
        starts."""
        election.drains = self.locks.drains_for
        election.quarantines = self.locks.quarantines_for

        def replan() -> None:
            elector = self._elector()
            if elector is not None:
                elector.notify_membership_changed()

        self.locks.drain_listeners.append(replan)

    async def close(self) -> None:
        """Wait for a leave in progress (the daemon stops once it is announced)."""
        if self._leaving is not None:
            await asyncio.gather(self._leaving, return_exceptions=True)

    async def drain(self, node: str, kill_after_s: float | None, by: str) -> DrainAnswer:
        """At the coordinator: drain `node` (its jobs are killed after `kill_after_s`; None: they
        finish), asked `by` a sender; the answer names the first plan that carries it."""
        return await self._apply(node, Drain(kill_after_s, time.time(), by))

    async def undrain(self, node: str) -> DrainAnswer:
        """At the coordinator: undrain `node`, and lift its GPU quarantine (held or not) with
        its history; the answer names the first plan without either."""
        return await self._apply(node, None)

    async def _apply(self, node: str, record: Drain | None) -> DrainAnswer:
        """At the coordinator: the table with the change on a majority, then the plan."""
        if record is not None:
            # a repeated drain keeps its first `since` and `by` unless kill_after_s changes
            def change(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
                old = table.drains.get(node)
                if old is not None and old.kill_after_s == record.kill_after_s:
                    return table, None
                return put_drain(table, term, node, record), None
        else:

            def change(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
                return lift(put_drain(table, term, node, None), term, node), None

        await self.locks.apply(change)
        draining = record is not None
        log.info(
            "node %s: %s %s", self.runtime.node_id, "drained" if draining else "undrained", node
        )
        plan, applied = await self._planned(node, draining)
        return DrainAnswer(
            node=node,
            draining=draining,
            kill_after_s=None if record is None else record.kill_after_s,
            coordinator=self.runtime.node_id,
            plan=None if plan is None else plan.fence.to_list(),
            applied=applied,
        )

    async def _planned(self, node: str, draining: bool) -> tuple[RolePlan | None, bool]:
        """The first plan of this coordinator that says `node` drains (or neither drains nor
        quarantines it), and whether `node` acknowledged it, within a few plan rounds (at once
        when `node` has no role in it: it is not an alive member)."""
        elector = self._elector()
        if elector is None:
            return None, False
        elector.notify_membership_changed()
        timeouts = self.runtime.settings.timeouts
        deadline = time.monotonic() + 2 * timeouts.lease_s + 2.0
        plan: RolePlan | None = None
        while time.monotonic() < deadline:
            current = elector.plan
            if current is not None and _settled(current, node, draining):
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

    def leave(self) -> None:
        """Make this node leave: gossip `left`, then stop the daemon (once; in the background)."""
        if self._leaving is None:
            self._leaving = asyncio.create_task(self._leave_and_stop(), name="node-leave")

    async def _leave_and_stop(self) -> None:
        try:
            await self._leave()
        except Exception as exc:  # peers detect the stopped node anyway
            log.warning("node %s: announcing the leave failed: %s", self.runtime.node_id, exc)
        self._stop("an operator asked this node to leave the cluster (shoal node leave)")

    async def ask_to_leave(
        self, node: str, path: str, proof: Mapping[str, str] | None = None, raw: bytes = b"{}"
    ) -> tuple[int, Any]:
        """Ask the alive member `node` to leave (POST `path` there, marked as forwarded, with
        the operator's `proof` of node.forwarding): its (status, JSON answer). LockError 404
        when it is not alive in this node's view, 503 when it cannot be reached."""
        member = member_of(self.runtime, node)
        if member is None or str(member.state) != "alive":
            state = "not in this node's view" if member is None else str(member.state)
            raise LockError(404, "unknown_node", f"node {node} is {state}; it cannot leave")
        peers = self.locks.peers
        url = peers.base_url(f"{member.address}:{member.port}")
        headers = {FORWARDED_HEADER: self.runtime.node_id, **(proof or {})}
        headers["Content-Type"] = "application/json"
        try:
            answer = await peers.request("POST", url, path, data=raw, headers=headers, check=False)
            return answer.status, answer.json() if answer.body else None
        except PeerRequestError as exc:
            raise LockError(503, "node_unreachable", f"{node}: {exc.reason}") from exc


def _settled(plan: RolePlan, node: str, draining: bool) -> bool:
    """Whether `plan` drains `node` (`draining`), or neither drains nor quarantines it."""
    if draining:
        return plan.is_draining(node)
    return not plan.is_draining(node) and node not in plan.quarantined
