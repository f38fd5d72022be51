"""The commit decision as a table: which (generation, step) every rank reported, and how the
log takes commits, copies, restores; the lock table keeps the log (and reads an older table
without it)."""

from __future__ import annotations

import dataclasses

import pytest

from node.checkpoints.commit import (
    MAX_PENDING_STEPS,
    RankReport,
    add_reports,
    committed_record,
    decide_commit,
    is_complete,
    prune_pending,
    with_commit,
    with_held,
    with_restore,
    with_targets,
)
from node.locks.checkpoints import CheckpointFile, CheckpointLog, RestoreRecord, step_directory
from node.locks.table import Drain, LockTable, put_checkpoints
from shoal._checkpoint_files import parse_step_directory
from shoal._checkpoint_files import step_directory as training_step_directory


def report(rank: int, step: int, generation: int = 1, world: int = 4, node: str = "") -> RankReport:
    node = node or f"n{rank // 2}"
    path = f"{step_directory(step, generation)}/__{rank}_0.distcp"
    return RankReport(node, rank, step, generation, world, (CheckpointFile(path, 10, "a" * 64),))


def pending_of(*reports: RankReport) -> dict[tuple[int, int], dict[int, RankReport]]:
    return add_reports({}, reports)


@pytest.mark.parametrize(
    ("reports", "newest", "decided"),
    [
        pytest.param([], None, None, id="nothing"),
        pytest.param([report(r, 20) for r in range(3)], None, None, id="3 of 4 ranks"),
        pytest.param([report(r, 20) for r in range(4)], None, (1, 20), id="all 4 ranks"),
        pytest.param([report(r, 20) for r in range(4)], 20, None, id="already committed"),
        pytest.param([report(r, 20) for r in range(4)], 40, None, id="older than committed"),
        pytest.param(
            [*(report(r, 20) for r in range(4)), *(report(r, 40) for r in range(4))],
            None,
            (1, 40),
            id="the newest complete step",
        ),
        pytest.param(
            [*(report(r, 20) for r in range(4)), *(report(r, 40) for r in range(3))],
            None,
            (1, 20),
            id="the newest step some rank missed is passed over",
        ),
        pytest.param(
            [*(report(r, 40, 1) for r in range(2)), *(report(r, 40, 2) for r in (2, 3))],
            None,
            None,
            id="two generations never add up to one",
        ),
        pytest.param(
            [*(report(r, 40, 1) for r in range(4)), *(report(r, 40, 2, 2) for r in range(2))],
            None,
            (2, 40),
            id="the newer generation of one step",
        ),
        pytest.param(
            [report(0, 20, world=2), report(1, 20, world=4)],
            None,
            None,
            id="ranks disagreeing on the world size",
        ),
        pytest.param(
            [report(0, 20, world=2), report(5, 20, world=2)],
            None,
            None,
            id="a rank outside the world",
        ),
    ],
)
def test_decide_commit(
    reports: list[RankReport], newest: int | None, decided: tuple[int, int] | None
) -> None:
    assert decide_commit(pending_of(*reports), newest) == decided


def test_a_rank_reporting_again_replaces_its_report() -> None:
    pending = pending_of(report(0, 20), report(0, 20, node="elsewhere"))
    assert [r.node for r in pending[(1, 20)].values()] == ["elsewhere"]
    assert not is_complete(pending[(1, 20)])


def test_the_record_of_a_commit_groups_files_by_node_each_holding_its_own() -> None:
    ranks = pending_of(*(report(r, 20) for r in range(4)))[(1, 20)]
    record = committed_record(ranks, 5.0, {"n0": ("n1",), "n1": ()})
    assert record.directory == "step-00000020-g1"
    assert sorted(record.files) == ["n0", "n1"]
    assert [f.path for f in record.files["n1"]] == [
        "step-00000020-g1/__2_0.distcp",
        "step-00000020-g1/__3_0.distcp",
    ]
    assert record.holders == {"n0": ("n0",), "n1": ("n1",)}
    assert record.targets == {"n0": ("n1",)}
    assert record.size_bytes == 40


def test_the_log_keeps_the_newest_steps_copies_and_restores() -> None:
    book = CheckpointLog()
    for step in (20, 40, 60, 80):
        ranks = pending_of(*(report(r, step) for r in range(4)))[(1, step)]
        book = with_commit(book, committed_record(ranks, 0.0, {"n0": ("n1",)}), keep=3)
    assert [record.step for record in book.committed] == [40, 60, 80]
    assert book.newest is not None
    assert book.find(60) is not None
    assert book.find(20) is None
    held = with_held(book, "n1", 80, 1, "n0")
    assert held.find(80) is not None
    newest = held.find(80)
    assert newest is not None
    assert newest.holders["n0"] == ("n0", "n1")
    assert "n0" not in newest.targets
    assert with_held(held, "n1", 80, 1, "n0") is held, "a copy confirmed twice changes nothing"
    assert with_held(held, "n1", 20, 1, "n0") == held, "a step no longer kept is ignored"
    asked = with_targets(held, {"n1": ("n0", "n2")})
    newest = asked.newest
    assert newest is not None
    assert newest.targets["n1"] == ("n0", "n2")
    assert with_targets(asked, {"n1": ("n2",)}) == asked
    restore = RestoreRecord(80, "peers", 40, 40, 1.5, 9.0)
    restored = with_restore(asked, "n2", restore)
    assert restored.restores == {"n2": restore}
    assert with_restore(restored, "n2", restore) is restored


def test_pending_reports_above_the_committed_step_are_kept_within_a_bound() -> None:
    pending = pending_of(*(report(0, step) for step in range(1, MAX_PENDING_STEPS + 10)))
    kept = prune_pending(pending, newest=5)
    assert min(step for _, step in kept) == 10
    assert len(kept) == MAX_PENDING_STEPS
    assert prune_pending(pending, newest=None).keys() == kept.keys()


def test_the_lock_table_keeps_the_log_and_reads_a_table_without_it() -> None:
    ranks = pending_of(*(report(r, 20) for r in range(4)))[(1, 20)]
    book = with_commit(CheckpointLog(), committed_record(ranks, 1.0, {}), keep=3)
    table = put_checkpoints(LockTable(), 2, book)
    assert table.version.to_list() == [2, 1]
    assert put_checkpoints(table, 2, book) is table
    again = LockTable.from_dict(table.to_dict())
    assert again == table
    assert again.checkpoints.newest == book.newest
    older = table.to_dict()
    del older["checkpoints"]
    assert LockTable.from_dict(older).checkpoints == CheckpointLog()
    changed = dataclasses.replace(table, drains={"n9": Drain(None)})
    assert changed.ordered().checkpoints == book, "other changes keep the log"


@pytest.mark.parametrize(("step", "generation"), [(0, 0), (40, 2), (123456789, 17)])
def test_the_daemon_names_step_directories_as_the_training_side_does(
    step: int, generation: int
) -> None:
    name = step_directory(step, generation)
    assert name == training_step_directory(step, generation)
    assert parse_step_directory(name) == (step, generation)
