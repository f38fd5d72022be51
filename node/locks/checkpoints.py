"""The committed checkpoints as the lock table keeps them on a majority of the voters: each
committed step (its files per node, who holds copies, who was asked to) and each node's last
restore. node.checkpoints decides what goes in; this module only says what a record is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

RestoreSource = Literal["local", "peers"]
_STEP = re.compile(r"step-(\d{8,})-g(\d+)\Z")


@dataclass(frozen=True)
class CheckpointFile:
    """One file of a committed step: its path inside the node's checkpoint directory
    (`step-00000040-g2/__3_0.distcp`), size and content hash (sync's manifest hash)."""

    path: str
    size: int
    hash: str


@dataclass(frozen=True)
class CommittedStep:
    """A step every rank of `generation` (`world_size` ranks) reported written, committed at
    `at` (unix seconds). `files`: owner node -> the files its ranks wrote; `holders`: owner ->
    the nodes known to hold those files (the owner first); `targets`: owner -> the nodes asked
    to copy them that have not confirmed yet."""

    step: int
    generation: int
    world_size: int
    at: float
    files: Mapping[str, tuple[CheckpointFile, ...]] = dataclasses.field(default_factory=dict)
    holders: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    targets: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def directory(self) -> str:
        """The step's directory inside every node's checkpoint directory."""
        return step_directory(self.step, self.generation)

    @property
    def size_bytes(self) -> int:
        return sum(f.size for files in self.files.values() for f in files)

    def all_files(self) -> tuple[tuple[str, CheckpointFile], ...]:
        """(owner, file) of every file of the step, by owner then path."""
        return tuple(
            (owner, f)
            for owner in sorted(self.files)
            for f in sorted(self.files[owner], key=lambda f: f.path)
        )


@dataclass(frozen=True)
class RestoreRecord:
    """A node's last restore: the step, where its files came from, the step's bytes, the bytes
    fetched from peers, and how long it took (fetch and load), finished at `at`."""

    step: int
    source: RestoreSource
    size_bytes: int
    fetched_bytes: int
    seconds: float
    at: float


@dataclass(frozen=True)
class CheckpointLog:
    """The committed steps (oldest first; the newest is the one to restore) and every node's
    last restore."""

    committed: tuple[CommittedStep, ...] = ()
    restores: Mapping[str, RestoreRecord] = dataclasses.field(default_factory=dict)

    @property
    def newest(self) -> CommittedStep | None:
        return self.committed[-1] if self.committed else None

    def find(self, step: int, generation: int | None = None) -> CommittedStep | None:
        """The committed record of `step` (of `generation` when given), or None."""
        for record in self.committed:
            if record.step == step and generation in (None, record.generation):
                return record
        return None


def step_directory(step: int, generation: int) -> str:
    """`step-00000040-g2`: where the ranks of `generation` write step `step` (named by step and
    generation, so a new generation saving the same step never writes over the old files).
    The training side names them alike (shoal._checkpoint_files; a test holds both to it)."""
    return f"step-{step:08d}-g{generation}"


def parse_step_directory(name: str) -> tuple[int, int] | None:
    """(step, generation) of a step directory's name, None for any other name."""
    match = _STEP.match(name)
    return None if match is None else (int(match[1]), int(match[2]))
