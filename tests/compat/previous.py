"""The previous release's source tree for the compatibility tests: the commit PREVIOUS_RELEASE
names, checked out with `git worktree add --detach` into a temporary directory (removed
afterwards), with a dist-info of its own so it announces release `0.0.0+previous`."""

from __future__ import annotations

import importlib.metadata as metadata
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import require_netns
from tests.skips import skip_unless_required

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_RELEASE = Path(__file__).with_name("PREVIOUS_RELEASE")
OLD_RELEASE = "0.0.0+previous"
"""The release the old tree announces: both trees run from one environment, whose installed
distribution would name one release for both; a dist-info first on the old tree's path tells
them apart."""


def previous_commit() -> str:
    """The commit PREVIOUS_RELEASE names (its first line that is not a comment)."""
    for line in PREVIOUS_RELEASE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    raise AssertionError(f"{PREVIOUS_RELEASE} names no commit")


def _git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@dataclass(frozen=True)
class OldTree:
    """The previous release's source tree and the PYTHONPATH its code runs with."""

    root: Path
    pythonpath: str


def _old_metadata(directory: Path) -> None:
    """The dist-info of the old tree: this environment's METADATA (its Requires-Dist, which the
    old tree's `shoal deploy` reads to pick the dependency wheels) and entry points (its
    wheel's `shoal` script), with the version OLD_RELEASE."""
    meta = directory / "shoal-0.0.0.dist-info"
    meta.mkdir(parents=True)
    installed = metadata.distribution("shoal")
    # `requires` reads a dist-info's METADATA and a source tree's shoal.egg-info (which an
    # editable install leaves in the clone, first on the path) alike.
    lines = ["Metadata-Version: 2.1", "Name: shoal", f"Version: {OLD_RELEASE}"]
    lines += [f"Requires-Dist: {requirement}" for requirement in installed.requires or []]
    (meta / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")
    entry_points = installed.read_text("entry_points.txt")
    if entry_points:
        (meta / "entry_points.txt").write_text(entry_points, encoding="utf-8")


@contextmanager
def previous_tree() -> Iterator[OldTree]:
    """The previous release checked out into a temporary directory, removed afterwards (also
    when the block fails). Skips (fails under CI's flag) without netns, git or the commit."""
    require_netns()
    if shutil.which("git") is None:
        skip_unless_required("needs git to check out the previous release")
    commit = previous_commit()
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
            # A shallow clone has no history to check out, and no way to fetch it offline.
            pytest.skip(
                f"this clone is shallow: the previous release {commit} is not in it "
                "(`git fetch --unshallow` to run the mixed-release test)"
            )
        skip_unless_required(
            f"the previous release {commit} (tests/compat/PREVIOUS_RELEASE) is not in this "
            "clone: fetch the history (a shallow clone has none)"
        )
    base = Path(tempfile.mkdtemp(prefix="shoal-compat-"))
    tree = base / "previous"
    try:
        added = _git("worktree", "add", "--detach", str(tree), commit)
        assert added.returncode == 0, added.stderr
        _old_metadata(base / "meta")
        yield OldTree(tree, f"{tree}:{base / 'meta'}")
    finally:
        _git("worktree", "remove", "--force", str(tree))
        _git("worktree", "prune")
        shutil.rmtree(base, ignore_errors=True)
