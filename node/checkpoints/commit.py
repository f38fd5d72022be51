"""The commit decision, without I/O: which step every rank of one generation reported written,
the record that commits it, and how the log keeps the newest steps. The coordinator
(node.checkpoints.office) applies these to the lock table's checkpoint log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from node.locks.checkpoints import CheckpointFile, CheckpointLog, CommittedStep, RestoreRecord

MAX_PENDING_STEPS = 32
"""Uncommitted (generation, step) pairs the coordinator keeps reports of; older ones go."""


@dataclass(frozen=True)
class RankReport:
    """Rank `rank` of `world_size` in `generation`, on node `node`, wrote its `files` of step
    `step`."""

    node: str
    rank: int
    step: int
    generation: int
    world_size: int
    files: tuple[CheckpointFile, ...]

    @property
    def key(self) -> tuple[int, int]:
        return self.generation, self.step


Pending = Mapping[tuple[int, int], Mapping[int, RankReport]]
"""(generation, step) -> rank -> the rank's report."""


def add_reports(
    pending: Pending, reports: Iterable[RankReport]
) -> dict[tuple[int, int], dict[int, RankReport]]:
    """`pending` with `reports` added (a rank reporting again replaces its report)."""
    out = {key: dict(ranks) for key, ranks in pending.items()}
    for report in reports:
        out.setdefault(report.key, {})[report.rank] = report
    return out


def is_complete(ranks: Mapping[int, RankReport]) -> bool:
    """True when ranks 0..world_size-1 all reported, every report naming the same world size."""
    sizes = {report.world_size for report in ranks.values()}
    if len(sizes) != 1:
        return False
    (world_size,) = sizes
    return set(ranks) == set(range(world_size))


def decide_commit(pending: Pending, newest: int | None) -> tuple[int, int] | None:
    """The (generation, step) to commit: the highest step above `newest` (the newest committed
    step, None when none is) that every rank of one generation reported; of two generations
    complete at the same step, the newer. None when no step qualifies."""
    ready = [
        (step, generation)
        for (generation, step), ranks in pending.items()
        if (newest is None or step > newest) and is_complete(ranks)
    ]
    if not ready:
        return None
    step, generation = max(ready)
    return generation, step


def committed_record(
    ranks: Mapping[int, RankReport],
    at: float,
    targets: Mapping[str, tuple[str, ...]],
) -> CommittedStep:
    """The record of a complete step: every node's files, each node holding its own, and the
    nodes asked to copy them (`targets`, owner -> nodes)."""
    first = next(iter(ranks.values()))
    files: dict[str, dict[str, CheckpointFile]] = {}
    for rank in sorted(ranks):
        report = ranks[rank]
        for item in report.files:
            files.setdefault(report.node, {})[item.path] = item
    return CommittedStep(
        step=first.step,
        generation=first.generation,
        world_size=first.world_size,
        at=at,
        files={
            node: tuple(by_path[p] for p in sorted(by_path))
            for node, by_path in sorted(files.items())
        },
        holders={node: (node,) for node in sorted(files)},
        targets={node: tuple(nodes) for node, nodes in sorted(targets.items()) if nodes},
    )


def with_commit(log: CheckpointLog, record: CommittedStep, keep: int) -> CheckpointLog:
    """`log` with `record` as its newest step, keeping the newest `keep` steps."""
    committed = (*log.committed, record)[-max(1, keep) :]
    return dataclasses.replace(log, committed=committed)


def with_held(
    log: CheckpointLog, node: str, step: int, generation: int, owner: str
) -> CheckpointLog:
    """`log` where `node` holds `owner`'s files of (`step`, `generation`): added to its holders,
    dropped from its targets. The same log when the step is gone or nothing changes."""
    changed = []
    for record in log.committed:
        if (record.step, record.generation) == (step, generation) and owner in record.files:
            holders = record.holders.get(owner, ())
            targets = record.targets.get(owner, ())
            if node in holders and node not in targets:
                return log
            record = dataclasses.replace(
                record,
                holders={
                    **record.holders,
                    owner: (*holders, node) if node not in holders else holders,
                },
                targets=_without(record.targets, owner, node),
            )
        changed.append(record)
    return dataclasses.replace(log, committed=tuple(changed))


def with_targets(log: CheckpointLog, added: Mapping[str, tuple[str, ...]]) -> CheckpointLog:
    """`log` whose newest step asks the nodes of `added` (owner -> nodes) for copies too."""
    newest = log.newest
    if newest is None or not any(added.values()):
        return log
    targets = dict(newest.targets)
    for owner, nodes in added.items():
        known = targets.get(owner, ())
        targets[owner] = (*known, *(n for n in nodes if n not in known))
    record = dataclasses.replace(newest, targets=targets)
    return dataclasses.replace(log, committed=(*log.committed[:-1], record))


def with_restore(log: CheckpointLog, node: str, restore: RestoreRecord) -> CheckpointLog:
    """`log` with `node`'s last restore; the same log when it is the one recorded."""
    if log.restores.get(node) == restore:
        return log
    return dataclasses.replace(log, restores={**log.restores, node: restore})


def prune_pending(
    pending: Pending, newest: int | None
) -> dict[tuple[int, int], dict[int, RankReport]]:
    """The reports still worth keeping: of steps above `newest`, the MAX_PENDING_STEPS newest."""
    alive = sorted(
        (key for key in pending if newest is None or key[1] > newest),
        key=lambda key: (key[1], key[0]),
    )[-MAX_PENDING_STEPS:]
    return {key: dict(pending[key]) for key in alive}


def _without(
    mapping: Mapping[str, tuple[str, ...]], key: str, node: str
) -> dict[str, tuple[str, ...]]:
    out = dict(mapping)
    left = tuple(n for n in out.get(key, ()) if n != node)
    if left:
        out[key] = left
    else:
        out.pop(key, None)
    return out
