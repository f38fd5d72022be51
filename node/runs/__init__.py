"""Runs: the cluster's fenced locks (a table on a majority of the voters, served by the
coordinator), and the Python lock client."""

from __future__ import annotations

from node.runs.client import LockClient, cluster_lock, default_holder
from node.runs.locks import LockService
from node.runs.quorum import Acceptor, QuorumTable
from node.runs.table import LockAnswer, LockFence, LockState, LockTable

__all__ = [
    "Acceptor",
    "LockAnswer",
    "LockClient",
    "LockFence",
    "LockService",
    "LockState",
    "LockTable",
    "QuorumTable",
    "cluster_lock",
    "default_holder",
]
