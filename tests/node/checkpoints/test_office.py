"""The coordinator's office over a lock table in memory: news commit a step once every rank
reported it, copies go only to nodes alive for `copy_after_s`, copies confirmed and restores
recorded land in the log."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.checkpoints.office import CheckpointOffice
from node.checkpoints.wire import HeldCopy, NewsBody, ReportedFile, ReportedRank, RestoreNews
from node.locks.table import LockTable


class Table:
    """The lock service's part the office uses: apply a change, the table it serves."""

    def __init__(self) -> None:
        self.table = LockTable()

    async def apply(
        self, operation: Callable[[LockTable, int, float], tuple[LockTable, Any]]
    ) -> Any:
        self.table, answer = operation(self.table, 1, 100.0)
        return answer

    async def current(self) -> LockTable:
        return self.table


def written(node: str, rank: int, step: int = 20, world: int = 2) -> NewsBody:
    files = [ReportedFile(path=f"step-{step:08d}-g1/__{rank}_0.distcp", size=5, hash="a" * 64)]
    report = ReportedRank(rank=rank, step=step, generation=1, world_size=world, files=files)
    return NewsBody(node=node, written=[report])


async def test_news_commit_a_step_and_copies_wait_for_settled_nodes() -> None:
    table, now = Table(), [0.0]
    alive = ["n1", "n2", "n3"]
    office = CheckpointOffice(
        table,  # type: ignore[arg-type]
        replicas=2,
        keep=3,
        domains={},
        alive=lambda: alive,
        copy_after_s=10.0,
        clock=lambda: now[0],
    )
    book = await office.receive(written("n1", 0))
    assert book.newest is None
    assert office.pending == {(1, 20): (0,)}
    now[0] = 5.0
    book = await office.receive(written("n2", 1))
    record = book.newest
    assert record is not None
    assert (record.step, sorted(record.files)) == (20, ["n1", "n2"])
    assert record.targets == {}, "no node has been alive 10 s yet"
    assert office.pending == {}
    assert office.commit_latencies_s == [0.0]
    now[0] = 12.0
    book = await office.receive(NewsBody(node="n3"))
    record = book.newest
    assert record is not None
    assert {o: sorted(n) for o, n in record.targets.items()} == {
        "n1": ["n2", "n3"],
        "n2": ["n1", "n3"],
    }
    held = NewsBody(node="n3", held=[HeldCopy(step=20, generation=1, owner="n1")])
    book = await office.receive(held)
    record = book.newest
    assert record is not None
    assert record.holders["n1"] == ("n1", "n3")
    assert record.targets["n1"] == ("n2",), "n3 confirmed its copy"
    restore = RestoreNews(
        step=20, source="peers", size_bytes=10, fetched_bytes=10, seconds=1.0, at=99.0
    )
    book = await office.receive(NewsBody(node="n3", restore=restore))
    assert book.restores["n3"].source == "peers"
    assert (await office.current()) == book
    version = table.table.version
    assert await office.receive(NewsBody(node="n3")) == book
    assert table.table.version == version, "news that change nothing store nothing"


async def test_a_node_that_joined_is_asked_only_once_settled() -> None:
    table, now = Table(), [0.0]
    alive = ["n1", "n2"]
    office = CheckpointOffice(
        table,  # type: ignore[arg-type]
        replicas=2,
        keep=3,
        domains={},
        alive=lambda: alive,
        copy_after_s=10.0,
        clock=lambda: now[0],
    )
    await office.receive(NewsBody(node="n1"))  # the office sees n1 and n2 alive from 0 s
    now[0] = 20.0
    await office.receive(written("n1", 0))
    book = await office.receive(written("n2", 1))
    record = book.newest
    assert record is not None
    assert record.targets == {"n1": ("n2",), "n2": ("n1",)}
    alive.append("n3")
    now[0] = 25.0
    record = (await office.receive(NewsBody(node="n1"))).newest
    assert record is not None
    assert "n3" not in {n for nodes in record.targets.values() for n in nodes}
    now[0] = 36.0
    record = (await office.receive(NewsBody(node="n1"))).newest
    assert record is not None
    assert {o: sorted(n) for o, n in record.targets.items()} == {
        "n1": ["n2", "n3"],
        "n2": ["n1", "n3"],
    }
