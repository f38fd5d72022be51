"""The lock table on a majority of voters: what a coordinator acknowledged survives it, and a
deposed coordinator can no longer store anything."""

from __future__ import annotations

import pytest

from node.election.seams import InMemoryDurableState
from node.errors import LockError
from node.locks.quorum import Acceptor, QuorumTable
from node.locks.table import LockTable, acquire

VOTERS = ("n1", "n2", "n3")


class MemoryPeers:
    """The acceptors of the other voters in this process; `down` ones do not answer."""

    def __init__(self, acceptors: dict[str, Acceptor]) -> None:
        self.acceptors = acceptors
        self.down: set[str] = set()

    def _to(self, to: str) -> Acceptor:
        if to in self.down:
            raise LockError(503, "voter_unreachable", f"{to} is down")
        return self.acceptors[to]

    async def prepare(self, to: str, term: int) -> LockTable:
        return await self._to(to).prepare(term)

    async def accept(self, to: str, term: int, table: LockTable) -> None:
        await self._to(to).accept(term, table)


def cluster() -> tuple[dict[str, InMemoryDurableState], dict[str, Acceptor], MemoryPeers]:
    disks = {v: InMemoryDurableState() for v in VOTERS}
    acceptors = {v: Acceptor(disks[v]) for v in VOTERS}
    return disks, acceptors, MemoryPeers(acceptors)


def quorum(node: str, acceptors: dict[str, Acceptor], peers: MemoryPeers) -> QuorumTable:
    return QuorumTable(node, VOTERS, acceptors[node], peers, timeout_s=2.0)


async def test_a_change_stored_on_a_majority_survives_the_coordinator() -> None:
    disks, acceptors, peers = cluster()
    old = quorum("n1", acceptors, peers)
    peers.down = {"n3"}
    table = await old.read(1)
    table, answer = acquire(table, 1, "train", "a", 30.0, True, 0.0)
    await old.write(1, table)
    # n1 dies, n3 comes back; n3 coordinates term 2 with n2 and n3 only, after a restart
    # of every acceptor from its disk.
    acceptors = {v: Acceptor(disks[v]) for v in VOTERS}
    peers = MemoryPeers(acceptors)
    peers.down = {"n1"}
    seen = await quorum("n3", acceptors, peers).read(2)
    assert seen.get("train").holder == "a"
    assert seen.get("train").fence == answer.fence


async def test_a_deposed_coordinator_cannot_store_a_change() -> None:
    _, acceptors, peers = cluster()
    old = quorum("n1", acceptors, peers)
    table = await old.read(1)
    await quorum("n2", acceptors, peers).read(2)
    changed, _ = acquire(table, 1, "train", "a", 30.0, True, 0.0)
    peers.down = set()
    with pytest.raises(LockError) as caught:
        await old.write(1, changed)
    assert caught.value.status == 503
    assert "stale" not in caught.value.code
    assert "older than term 2" in caught.value.reason


async def test_no_majority_no_acknowledgement() -> None:
    _, acceptors, peers = cluster()
    peers.down = {"n2", "n3"}
    with pytest.raises(LockError) as caught:
        await quorum("n1", acceptors, peers).read(1)
    assert caught.value.code == "no_lock_quorum"


async def test_a_change_acknowledged_after_a_failed_write_survives_a_failover() -> None:
    """A write that reached one voter only fails; the coordinator re-reads a majority without
    that voter and acknowledges its next change on a majority that includes it. Were the next
    change numbered like the failed one, that voter would keep the failed table (a voter ignores
    a version it already has) while answering as if it stored the change, and the next
    coordinator, reading it and a voter that missed both, would lose an acknowledged waiter."""
    _, acceptors, peers = cluster()
    coordinator = QuorumTable("n0", VOTERS, Acceptor(InMemoryDurableState()), peers, 2.0)
    table, _ = acquire(await coordinator.read(1), 1, "train", "a", 30.0, True, 0.0)
    await coordinator.write(1, table)
    failed, _ = acquire(table, 1, "train", "b", 30.0, True, 1.0)
    peers.down = {"n2", "n3"}
    with pytest.raises(LockError):
        await coordinator.write(1, failed)  # stored on n1 alone
    peers.down = {"n1"}
    table = await coordinator.read(1)  # n2 and n3: the table before the failed write
    assert table.get("train").position_of("b") is None
    table, answer = acquire(table, 1, "train", "c", 30.0, True, 2.0)
    assert table.version > failed.version
    peers.down = {"n3"}
    await coordinator.write(1, table)  # acknowledged by n1 and n2
    assert answer.position == 1
    peers.down = {"n2"}
    seen = await quorum("n3", acceptors, peers).read(2)  # n1 and n3
    assert seen.get("train").position_of("c") is not None


async def test_a_coordinator_never_sends_two_tables_under_one_version() -> None:
    _, acceptors, peers = cluster()
    coordinator = quorum("n1", acceptors, peers)
    base = await coordinator.read(1)
    first, _ = acquire(base, 1, "train", "a", 30.0, True, 0.0)
    await coordinator.write(1, first)
    other, _ = acquire(base, 1, "train", "b", 30.0, True, 0.0)
    assert other.version == first.version
    with pytest.raises(LockError) as caught:
        await coordinator.write(1, other)
    assert caught.value.code == "lock_version_reused"
