"""Locks: the cluster's fenced locks (a table on a majority of the voters, served by the
coordinator) and the Python lock client. The table also keeps the run queue's steps (node.runs),
so both survive a coordinator failover together."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.locks.client import LockClient, cluster_lock, default_holder
    from node.locks.component import LockApi, lock_api
    from node.locks.quorum import Acceptor, QuorumTable
    from node.locks.service import LockService
    from node.locks.table import LockAnswer, LockFence, LockState, LockTable
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
