"""Checkpoints the cluster commits and keeps on peers: the ranks' written reports, the commit on
a majority of the voters (in the lock table), copies on peers across failure domains through
the sync engine, retention, and restores that fetch what a node lacks (docs/checkpoints.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.checkpoints.commit import RankReport, decide_commit
    from node.checkpoints.component import CheckpointApi, checkpoint_api
    from node.checkpoints.office import CheckpointOffice
    from node.checkpoints.replicas import Domain, plan_replicas
    from node.checkpoints.service import CheckpointService
    from node.checkpoints.view import checkpoints_view, committed_view, last_restore_view
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.checkpoints.commit": "RankReport decide_commit",
            "node.checkpoints.component": "CheckpointApi checkpoint_api",
            "node.checkpoints.office": "CheckpointOffice",
            "node.checkpoints.replicas": "Domain plan_replicas",
            "node.checkpoints.service": "CheckpointService",
            "node.checkpoints.view": "checkpoints_view committed_view last_restore_view",
        },
    )

__all__ = [
    "CheckpointApi",
    "CheckpointOffice",
    "CheckpointService",
    "Domain",
    "RankReport",
    "checkpoint_api",
    "checkpoints_view",
    "committed_view",
    "decide_commit",
    "last_restore_view",
    "plan_replicas",
]
