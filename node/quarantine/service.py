"""GPU quarantines at the coordinator, and a node's way there: the coordinator records a node's
quarantine or re-admission in the lock table (on a majority of the voters: the plan follows, and
a new coordinator keeps it); a node reaches the coordinator the way drains do, or serves itself
while it coordinates.
"""

from __future__ import annotations

import logging

from node.errors import LockError
from node.locks.quarantines import WINDOW_S, held_reason, quarantine, readmit
from node.locks.service import LockService
from node.locks.table import LockTable, Quarantine
from node.quarantine.wire import (
    QUARANTINE_PATH,
    READMIT_PATH,
    QuarantineAnswer,
    QuarantineBody,
    ReadmitBody,
)

log = logging.getLogger(__name__)


class QuarantineService:
    """The coordinator's side: quarantine and re-admit nodes in the table it serves."""

    def __init__(self, locks: LockService) -> None:
        self.locks = locks

    @property
    def node_id(self) -> str:
        return self.locks.runtime.node_id

    async def report(self, body: QuarantineBody) -> QuarantineAnswer:
        """Quarantine `body.node` for its GPU fault (nothing changes when it already is); the
        quarantine that reaches the node's limit within the hour is held."""
        limit = self.locks.runtime.settings.gpu_quarantine_limit
        done: list[tuple[Quarantine, bool]] = []

        def change(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
            changed, record, new = quarantine(table, term, body.node, body.reason, now, limit)
            done.append((record, new))
            return changed, None

        await self.locks.apply(change)
        record, new = done[-1]
        if new:
            log.warning(
                "node %s: quarantined %s (%s), %d within %g s%s",
                self.node_id,
                body.node,
                record.reason,
                len(record.times),
                WINDOW_S,
                ": held until an undrain" if record.held else "",
            )
        return self._answer(body.node, record, new)

    async def readmit(self, body: ReadmitBody) -> QuarantineAnswer:
        """Re-admit `body.node` (nothing changes when it is not quarantined); LockError 409
        `quarantine_held` when its quarantine is held."""
        done: list[bool] = []

        def change(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
            changed, back = readmit(table, term, body.node, now)
            done.append(back)
            return changed, None

        await self.locks.apply(change)
        if done[-1]:
            log.info(
                "node %s: re-admitted %s (self-test: %s)", self.node_id, body.node, body.selftest
            )
        return self._answer(body.node, self.locks.table.quarantines.get(body.node), done[-1])

    def _answer(self, node: str, record: Quarantine | None, changed: bool) -> QuarantineAnswer:
        if record is None or not record.active:
            count = 0 if record is None else len(record.times)
            return QuarantineAnswer(
                node=node, coordinator=self.node_id, quarantined=False, changed=changed, count=count
            )
        return QuarantineAnswer(
            node=node,
            coordinator=self.node_id,
            quarantined=True,
            changed=changed,
            held=record.held,
            count=len(record.times),
            reason=held_reason(node, record) if record.held else record.reason,
        )


class CoordinatorLink:
    """A node's calls to the coordinator about its own GPUs: over HTTP, forwarded like drains
    (LockService.call_coordinator), or served here while this node coordinates."""

    def __init__(self, service: QuarantineService) -> None:
        self.service = service

    async def report(self, body: QuarantineBody) -> QuarantineAnswer:
        """Report this node's GPU fault. LockError when the coordinator cannot be reached or
        refuses."""
        answer = await self._call(QUARANTINE_PATH, body)
        return answer if answer is not None else await self.service.report(body)

    async def readmit(self, body: ReadmitBody) -> QuarantineAnswer:
        """Ask to be re-admitted. LockError 409 `quarantine_held` when only an undrain can."""
        answer = await self._call(READMIT_PATH, body)
        return answer if answer is not None else await self.service.readmit(body)

    async def _call(self, path: str, body: QuarantineBody | ReadmitBody) -> QuarantineAnswer | None:
        locks = self.service.locks
        answered = await locks.call_coordinator("POST", path, body.model_dump(), forwarded=False)
        if answered is None:
            return None
        status, data = answered
        if status != 200:
            code = data.get("error") if isinstance(data, dict) else None
            reason = data.get("reason") if isinstance(data, dict) else None
            raise LockError(status, str(code or "refused"), str(reason or data))
        try:
            return QuarantineAnswer.model_validate(data)
        except ValueError as exc:
            raise LockError(502, "bad_quarantine_answer", f"{path}: {exc}") from exc
