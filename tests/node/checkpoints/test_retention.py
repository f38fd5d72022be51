"""Retention as a table: the newest `keep` committed steps stay (the newest always), older and
never-committed steps go, a step above the newest committed stays while it may be written."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node.checkpoints.retention import STALE_S, directory_ages, doomed, sweep
from node.locks.checkpoints import CheckpointLog, CommittedStep, step_directory


def committed(*steps: int, generation: int = 1) -> CheckpointLog:
    return CheckpointLog(tuple(CommittedStep(s, generation, 2, 0.0) for s in steps))


def d(step: int, generation: int = 1) -> str:
    return step_directory(step, generation)


FRESH = 1.0
OLD = STALE_S + 1


@pytest.mark.parametrize(
    ("ages", "book", "keep", "gone"),
    [
        pytest.param({d(20): FRESH}, committed(), 3, [], id="nothing committed: in progress"),
        pytest.param({d(20): OLD}, committed(), 3, [d(20)], id="nothing committed, stale"),
        pytest.param(
            {d(20): OLD, d(40): OLD, d(60): OLD, d(80): OLD},
            committed(20, 40, 60, 80),
            3,
            [d(20)],
            id="beyond the kept steps",
        ),
        pytest.param({d(80): OLD}, committed(20, 40, 60, 80), 1, [], id="the newest stays"),
        pytest.param({d(40): FRESH, d(60): FRESH}, committed(40, 60), 1, [d(40)], id="keep 1"),
        pytest.param(
            {d(30): FRESH, d(40): FRESH},
            committed(20, 40),
            3,
            [d(30)],
            id="a step no rank finished",
        ),
        pytest.param(
            {d(40, 1): FRESH, d(40, 2): FRESH},
            committed(40, generation=2),
            3,
            [d(40, 1)],
            id="the same step of another generation",
        ),
        pytest.param(
            {d(60): FRESH, d(80): OLD}, committed(40), 3, [d(80)], id="above committed: while fresh"
        ),
        pytest.param({"models": OLD, "step-1-g1": OLD}, committed(40), 3, [], id="other names"),
    ],
)
def test_doomed(ages: dict[str, float], book: CheckpointLog, keep: int, gone: list[str]) -> None:
    assert doomed(ages, book, keep) == gone


def test_sweep_deletes_the_doomed_directories_only(tmp_path: Path) -> None:
    for name in (d(20), d(30), d(40), "notes"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__0_0.distcp").write_bytes(b"x")
    old = time.time() - 2 * STALE_S
    os.utime(tmp_path / d(30), (old, old))
    os.utime(tmp_path / d(30) / "__0_0.distcp", (old, old))
    ages = directory_ages(tmp_path)
    assert set(ages) == {d(20), d(30), d(40)}
    assert ages[d(30)] > STALE_S > ages[d(20)]
    assert sweep(tmp_path, committed(20, 40), keep=1) == [d(20), d(30)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", d(40)]
    assert directory_ages(tmp_path / "absent") == {}


def test_a_file_going_away_during_the_ages_closes_every_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file a writer or a sweep removes between the listing and its stat: that step is skipped
    and every directory listing is closed (CI: an unclosed scandir iterator, reported when the
    garbage collector found it, failed a checkpoint test)."""
    for name in (d(20), d(30)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__0_0.distcp").write_bytes(b"x")
    (tmp_path / d(30) / "__1_0.distcp").write_bytes(b"x")
    listings: list[Listing] = []
    real = os.scandir

    class Listing:
        def __init__(self, path: str) -> None:
            self.entries = list(real(path))
            self.closed = False
            listings.append(self)

        def __iter__(self) -> Listing:
            return self

        def __next__(self) -> os.DirEntry[str]:
            if not self.entries:
                raise StopIteration
            entry = self.entries.pop(0)
            if entry.name == "__1_0.distcp":
                os.unlink(entry.path)  # gone between the listing and the stat
            return entry

        def __enter__(self) -> Listing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.closed = True

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(os, "scandir", Listing)
    assert set(directory_ages(tmp_path)) == {d(20)}
    assert len(listings) == 3
    assert all(listing.closed for listing in listings)
