"""What the API shows of checkpoints: the newest committed step (`committed`) and a node's last
restore (`last_restore`), as /v1/checkpoints serves them and /v1/training carries them."""

from __future__ import annotations

from node.checkpoints.wire import CheckpointsView, CommittedView, LastRestoreView, NodeCheckpoints
from node.locks.checkpoints import CheckpointLog, CommittedStep, RestoreRecord


def committed_view(record: CommittedStep | None) -> CommittedView | None:
    """`{"step", "generation", "world_size", "at", "bytes", "holders": {NODE: [nodes]}}` of a
    committed step, None for none."""
    if record is None:
        return None
    return CommittedView(
        step=record.step,
        generation=record.generation,
        world_size=record.world_size,
        at=record.at,
        size_bytes=record.size_bytes,
        holders={owner: list(nodes) for owner, nodes in sorted(record.holders.items())},
    )


def last_restore_view(record: RestoreRecord | None) -> LastRestoreView | None:
    """`{"step", "from": "local" | "peers", "bytes", "fetched_bytes", "seconds", "at"}` of a
    node's last restore, None for none."""
    if record is None:
        return None
    return LastRestoreView(
        step=record.step,
        source=record.source,
        size_bytes=record.size_bytes,
        fetched_bytes=record.fetched_bytes,
        seconds=record.seconds,
        at=record.at,
    )


def checkpoints_view(
    book: CheckpointLog, coordinator: str, replicas: int, keep: int, nodes: list[str]
) -> CheckpointsView:
    """The answer of GET /v1/checkpoints: the log, and the last restore of each of `nodes` and
    of every node that restored."""
    named = sorted({*nodes, *book.restores})
    return CheckpointsView(
        coordinator=coordinator,
        replicas=replicas,
        keep=keep,
        committed=committed_view(book.newest),
        steps=[view for view in map(committed_view, book.committed) if view is not None],
        nodes={
            node: NodeCheckpoints(last_restore=last_restore_view(book.restores.get(node)))
            for node in named
        },
    )
