"""The lock service of a node: the coordinator serves the cluster's locks from the table kept on
a majority of the voters (node.locks.quorum); every other node forwards to the coordinator. A
voter keeps its acceptor here. The routes that call it are node.locks.routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from health import LoopHealth
from net import Identity, PeerClient, PeerRequestError, peer_url
from node.access import FORWARDED_HEADER
from node.audit.entries import RUN_STEP, record_audit, run_steps
from node.errors import LockError
from node.identity.peers import peer_tls
from node.locks.quarantines import quarantine_map
from node.locks.quorum import Acceptor, Durable, QuorumTable
from node.locks.table import (
    LockAnswer,
    LockFence,
    LockTable,
    acquire,
    drain_map,
    expire,
    release,
    renew,
    take_over,
)
from node.locks.wire import (
    ACCEPT_PATH,
    MAX_WAIT_S,
    PREPARE_PATH,
)
from node.runtime import NodeRuntime

log = logging.getLogger(__name__)

EXPIRY_TICK_S = 0.2

Operation = Callable[[LockTable, int, float], tuple[LockTable, LockAnswer | None]]


class HttpPeers:
    """The other voters' acceptors over signed HTTP."""

    def __init__(self, url_of: Callable[[str], str | None], peers: PeerClient):
        self.url_of = url_of
        self._peers = peers

    async def _post(self, to: str, path: str, body: dict[str, object]) -> Any:
        url = self.url_of(to)
        if url is None:
            raise LockError(503, "voter_unknown", f"voter {to} is not in the membership view")
        try:
            status, answer = await self._peers.call_json("POST", url, path, body)
        except PeerRequestError as exc:
            raise LockError(503, "voter_unreachable", f"voter {to}: {exc.reason}") from exc
        if status != 200:
            reason = answer.get("reason") if isinstance(answer, dict) else answer
            raise LockError(status, "voter_refused", f"voter {to}: {reason}")
        return answer

    async def prepare(self, to: str, term: int) -> LockTable:
        answer = await self._post(to, PREPARE_PATH, {"term": term})
        return LockTable.from_dict(answer["table"])

    async def accept(self, to: str, term: int, table: LockTable) -> None:
        await self._post(to, ACCEPT_PATH, {"term": term, "table": table.to_dict()})


class LockService:
    """This node's part in the cluster's locks: a voter's acceptor, the coordinator's table
    while this node coordinates, forwarding otherwise, and the expiry loop."""

    def __init__(
        self,
        runtime: NodeRuntime,
        voters: tuple[str, ...],
        durable: Durable,
        secret: bytes | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.runtime = runtime
        self.voters = voters
        self.acceptor = Acceptor(durable)
        self._secret = secret
        self._clock = clock
        self._peers: PeerClient | None = None
        self._quorum: QuorumTable | None = None
        self._mutex = asyncio.Lock()
        self._office_term: int | None = None
        self.table = LockTable()
        self._changed = asyncio.Condition()
        self._ticker: asyncio.Task[None] | None = None
        self.loop_health = LoopHealth("locks")
        self.drain_listeners: list[Callable[[], None]] = []
        """Called when the coordinator's drained or quarantined nodes may have changed (read or
        written)."""

    # lifecycle

    async def open(self) -> None:
        timeouts = self.runtime.settings.timeouts
        self._peers = PeerClient(
            Identity(self._secret, self.runtime.node_id, self.runtime.settings.cluster_name),
            timeouts=timeouts,
            tls=peer_tls(self.runtime),
        )
        peers = HttpPeers(self.url_of, self._peers)
        self._quorum = QuorumTable(
            self.runtime.node_id, self.voters, self.acceptor, peers, timeouts.http_request_s
        )
        self._ticker = asyncio.create_task(self._expiry_loop(), name="locks-expiry")

    async def close(self) -> None:
        """Stop the expiry loop and the peer client. Idempotent."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        if self._peers is not None:
            await self._peers.close()
            self._peers = None

    def url_of(self, node_id: str) -> str | None:
        membership = self.runtime.membership
        for member in membership.members() if membership is not None else []:
            if member.node_id == node_id:
                return peer_url(member.address, member.port)
        return None

    @property
    def peers(self) -> PeerClient:
        """The signed peer client (net.PeerClient); LockError 503 before `open`."""
        if self._peers is None:
            raise LockError(503, "locks_closed", "the lock service is not running")
        return self._peers

    # the coordinator's table

    def is_coordinator(self) -> bool:
        runtime = self.runtime
        runtime.refresh()
        return runtime.coordinator == runtime.node_id and runtime.term is not None

    async def _office(self) -> tuple[int, LockTable]:
        """This coordinator's term and table, read from a majority once per term."""
        term = self.runtime.term
        assert term is not None
        assert self._quorum is not None
        if self._office_term != term:
            self._office_term = None
            table = await self._quorum.read(term)
            table = take_over(table, term, self._clock())
            await self._quorum.write(term, table)
            self.table, self._office_term = table, term
            log.info("locks: coordinator of term %d serves %d locks", term, len(table.locks))
            self._drains_changed()
        return term, self.table

    def drains_for(self, term: int) -> dict[str, float | None] | None:
        """The drained nodes (node id -> kill_after_s) of the table this node serves as the
        coordinator of `term`; None until it has read the table of that term from a majority."""
        if self._office_term != term:
            return None
        return drain_map(self.table)

    def quarantines_for(self, term: int) -> dict[str, str] | None:
        """The quarantined nodes (node id -> reason) of the table this node serves as the
        coordinator of `term`; None until it has read the table of that term from a majority."""
        if self._office_term != term:
            return None
        return quarantine_map(self.table)

    def _drains_changed(self) -> None:
        for listener in list(self.drain_listeners):
            try:
                listener()
            except Exception:
                log.exception("locks: a drain listener failed")

    async def apply(self, operation: Operation) -> LockAnswer | None:
        """Run `operation` on the coordinator's table and store its result on a majority."""
        async with self._mutex:
            term, table = await self._office()
            changed, answer = operation(table, term, self._clock())
            if changed is not table:
                assert self._quorum is not None
                try:
                    await self._quorum.write(term, changed)
                except LockError:
                    self._office_term = None  # re-read the majority before serving again
                    raise
                self.table = changed
                if changed.drains != table.drains or changed.quarantines != table.quarantines:
                    self._drains_changed()
                for step in run_steps(table.runs, changed.runs):
                    await record_audit(self.runtime.wal, RUN_STEP, step, self.runtime.node_id)
                async with self._changed:
                    self._changed.notify_all()
            return answer

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_TICK_S)
            if not self.is_coordinator():
                self._office_term = None
                continue
            try:
                await self.apply(lambda t, term, now: (expire(t, term, now), None))
            except LockError as exc:
                self.loop_health.record_failure(exc.reason)
            else:
                self.loop_health.record_success(f"{len(self.table.locks)} locks")

    async def acquire(
        self, name: str, holder: str, ttl_s: float, wait: bool, wait_s: float
    ) -> LockAnswer:
        """Acquire on the coordinator; a waiter is answered when granted or after `wait_s`."""

        def attempt(table: LockTable, term: int, now: float) -> tuple[LockTable, LockAnswer]:
            return acquire(table, term, name, holder, ttl_s, wait, now)

        answer = await self.apply(attempt)
        assert answer is not None
        deadline = time.monotonic() + wait_s
        while wait and not answer.granted:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._office_term is None:
                return answer
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
            state = self.table.get(name)
            position = state.position_of(holder)
            if position == 0:
                return LockAnswer(name, holder, True, state.fence, 0, state.expires_at)
            if position is None:
                return LockAnswer(name, holder, False, None, None)
            answer = LockAnswer(name, holder, False, None, position)
        return answer

    async def renew(self, name: str, holder: str, fence: LockFence | None) -> LockAnswer:
        """Renew `holder`'s lease of `name` on the coordinator; LockError 409 when it was lost."""
        answer = await self.apply(lambda t, term, now: renew(t, term, name, holder, fence, now))
        assert answer is not None
        return answer

    async def release(self, name: str, holder: str, fence: LockFence | None) -> None:
        """Release `name` held by `holder` on the coordinator; the first waiter gets it."""

        def give_up(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
            return release(table, term, name, holder, fence, now), None

        await self.apply(give_up)

    async def current(self) -> LockTable:
        """The coordinator's table of this term (read from a majority first when it is new)."""
        await self.apply(lambda t, term, now: (t, None))
        return self.table.ordered()

    # forwarding to the coordinator

    async def call_coordinator(
        self,
        method: str,
        path: str,
        body: Any,
        *,
        forwarded: bool,
        raw: bytes | None = None,
        proof: Mapping[str, str] | None = None,
    ) -> tuple[int, Any] | None:
        """None when this node is the coordinator and serves the call itself; otherwise the
        coordinator's (status, JSON answer) to `method path` with `body` (or the bytes `raw`
        of the request forwarded, with the headers `proof` of node.forwarding, so the
        coordinator acts as the operator who asked). A call `forwarded` here already is not
        forwarded again: LockError 503 `not_coordinator` (retry)."""
        if self.is_coordinator():
            return None
        coordinator = self.runtime.coordinator
        if forwarded or coordinator is None:
            who = "no coordinator yet" if coordinator is None else f"{coordinator} coordinates"
            raise LockError(503, "not_coordinator", f"node {self.runtime.node_id}: {who}; retry")
        url = self.url_of(coordinator)
        if url is None or self._peers is None:
            raise LockError(503, "coordinator_unknown", f"coordinator {coordinator} not in view")
        headers = {FORWARDED_HEADER: self.runtime.node_id, **(proof or {})}
        wait_s = self.runtime.settings.timeouts.http_request_s + MAX_WAIT_S
        try:
            if raw is None:
                return await self._peers.call_json(
                    method, url, path, body, headers=headers, timeout_s=wait_s
                )
            headers["Content-Type"] = "application/json"
            answer = await self._peers.request(
                method, url, path, data=raw, headers=headers, timeout_s=wait_s, check=False
            )
            return answer.status, answer.json() if answer.body else None
        except ValueError as exc:
            raise LockError(503, "coordinator_unreachable", f"{coordinator}: not JSON") from exc
        except PeerRequestError as exc:
            raise LockError(503, "coordinator_unreachable", f"{coordinator}: {exc.reason}") from exc

    # the voter's acceptor

    async def prepare(self, term: int) -> LockTable:
        """Promise `term` as a voter; the table it stores. LockError 409 on a non-voter."""
        self._check_voter()
        return await self.acceptor.prepare(term)

    async def accept(self, term: int, table: LockTable) -> None:
        """Store `table` under `term` as a voter. LockError 409 on a non-voter."""
        self._check_voter()
        await self.acceptor.accept(term, table)

    def _check_voter(self) -> None:
        if self.runtime.node_id not in self.voters:
            raise LockError(409, "not_a_voter", f"node {self.runtime.node_id} is not a voter")
