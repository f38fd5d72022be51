"""The lock table kept on a majority of the voters: every voter stores the newest table it was
given and the highest term it promised; a coordinator reads a majority before it serves (so it
sees every change acknowledged under an older term) and acknowledges a change only once a
majority stored it. A deposed coordinator cannot store anything: the voters promised a newer term.

A coordinator never sends two different tables under one version. A write that failed may
still sit on a voter outside the next majority it reads; were the next change numbered like it,
that voter would keep the failed table and answer as if it held the change (a voter ignores a
version it already has), and a later majority read could lose an acknowledged change. So after
a failed write the coordinator numbers its next change past every version it sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from node.errors import LockError
from node.locks.table import LockFence, LockTable

log = logging.getLogger(__name__)

ACCEPTOR_KEY = "runs.locks"
"""DurableState key of {"promised": term, "table": LockTable.to_dict()} on every voter."""


class Durable(Protocol):
    """Small durable key/value state; `set` returns once the value is on disk (the WAL)."""

    async def get(self, key: str) -> Any: ...
    async def set(self, key: str, value: Any) -> None: ...


class Acceptor:
    """One voter's copy of the lock table. Changes are serialized; each is on disk before it
    is answered."""

    def __init__(self, durable: Durable) -> None:
        self._durable = durable
        self._lock = asyncio.Lock()
        self._loaded = False
        self.promised = 0
        self.table = LockTable()

    async def _load(self) -> None:
        if self._loaded:
            return
        stored = await self._durable.get(ACCEPTOR_KEY)
        if stored is not None:
            self.promised = int(stored["promised"])
            self.table = LockTable.from_dict(stored["table"])
        self._loaded = True

    async def _store(self, promised: int, table: LockTable) -> None:
        await self._durable.set(ACCEPTOR_KEY, {"promised": promised, "table": table.to_dict()})
        self.promised, self.table = promised, table

    def _refuse_older(self, term: int) -> None:
        if term < self.promised:
            raise LockError(
                409,
                "stale_term",
                f"term {term} is older than term {self.promised} this voter promised; "
                "a newer coordinator serves the locks",
            )

    async def prepare(self, term: int) -> LockTable:
        """Promise to refuse tables of terms below `term`; answers the newest table stored."""
        async with self._lock:
            await self._load()
            self._refuse_older(term)
            if term > self.promised:
                await self._store(term, self.table)
            return self.table

    async def accept(self, term: int, table: LockTable) -> None:
        """Store `table` written under `term` unless a newer term was promised."""
        async with self._lock:
            await self._load()
            self._refuse_older(term)
            if table.version > self.table.version or term > self.promised:
                newest = table if table.version > self.table.version else self.table
                await self._store(term, newest)


class Peers(Protocol):
    """The other voters' acceptors, reached over the network."""

    async def prepare(self, to: str, term: int) -> LockTable: ...
    async def accept(self, to: str, term: int, table: LockTable) -> None: ...


class QuorumTable:
    """The coordinator's side: reads and writes the table on a majority of `voters`."""

    def __init__(
        self,
        node_id: str,
        voters: Sequence[str],
        local: Acceptor,
        peers: Peers,
        timeout_s: float,
    ) -> None:
        self.node_id = node_id
        self.voters = tuple(voters)
        self.local = local
        self.peers = peers
        self.timeout_s = timeout_s
        self.sent: LockFence | None = None
        """The newest version this coordinator sent to the voters (stored or not)."""

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    async def _on_majority(self, calls: Mapping[str, Any], what: str) -> list[Any]:
        """Run one call per voter; the answers of the first majority that succeeded."""
        tasks = {asyncio.ensure_future(call): voter for voter, call in calls.items()}
        answers: list[Any] = []
        errors: list[str] = []
        try:
            for done in asyncio.as_completed(list(tasks), timeout=self.timeout_s):
                try:
                    answers.append(await done)
                except LockError as exc:
                    errors.append(exc.reason)
                if len(answers) >= self.majority:
                    return answers
        except TimeoutError:
            errors.append(f"no answer within {self.timeout_s:g} s")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        raise LockError(
            503,
            "no_lock_quorum",
            f"{what}: {len(answers)} of {len(self.voters)} voters answered, "
            f"{self.majority} needed ({'; '.join(errors[:3]) or 'unreachable'}); retry shortly",
        )

    async def read(self, term: int) -> LockTable:
        """The newest table on a majority, after each of them promised `term`."""
        calls = {
            voter: self.local.prepare(term)
            if voter == self.node_id
            else self.peers.prepare(voter, term)
            for voter in self.voters
        }
        tables: list[LockTable] = await self._on_majority(calls, f"reading the locks (term {term})")
        newest = max(tables, key=lambda t: t.version)
        if self.sent is not None and self.sent > newest.version:
            # a failed write of ours may be on a voter outside this majority: the next change
            # must be numbered past it (see the module's docstring)
            newest = dataclasses.replace(newest, version=self.sent)
        return newest

    async def write(self, term: int, table: LockTable) -> None:
        """Return only once a majority of the voters stored `table`."""
        if self.sent is not None and table.version <= self.sent:
            raise LockError(
                500,
                "lock_version_reused",
                f"lock change {table.version.to_list()} is not newer than "
                f"{self.sent.to_list()}, already sent to the voters; re-read the locks",
            )
        self.sent = table.version
        calls = {
            voter: self.local.accept(term, table)
            if voter == self.node_id
            else self.peers.accept(voter, term, table)
            for voter in self.voters
        }
        version = table.version.to_list()
        await self._on_majority(calls, f"storing lock change {version} (term {term})")
