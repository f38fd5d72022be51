"""Runs: the cluster's fenced locks (a table on a majority of the voters, served by the
coordinator), the Python lock client, the queue of runs and the results store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.runs.client import LockClient, cluster_lock, default_holder
    from node.runs.locks import LockService
    from node.runs.nodes import NodeStarter, ProviderNodes, StaticNodes
    from node.runs.queue import RunSpec, parse_run_spec
    from node.runs.quorum import Acceptor, QuorumTable
    from node.runs.results import LocalResults, ResultsStore, open_results_store, result_key
    from node.runs.service import RunService
    from node.runs.table import LockAnswer, LockFence, LockState, LockTable
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.runs.client": "LockClient cluster_lock default_holder",
            "node.runs.locks": "LockService",
            "node.runs.nodes": "NodeStarter ProviderNodes StaticNodes",
            "node.runs.queue": "RunSpec parse_run_spec",
            "node.runs.quorum": "Acceptor QuorumTable",
            "node.runs.results": "LocalResults ResultsStore open_results_store result_key",
            "node.runs.service": "RunService",
            "node.runs.table": "LockAnswer LockFence LockState LockTable",
        },
    )

__all__ = [
    "Acceptor",
    "LocalResults",
    "LockAnswer",
    "LockClient",
    "LockFence",
    "LockService",
    "LockState",
    "LockTable",
    "NodeStarter",
    "ProviderNodes",
    "QuorumTable",
    "ResultsStore",
    "RunService",
    "RunSpec",
    "StaticNodes",
    "cluster_lock",
    "default_holder",
    "open_results_store",
    "parse_run_spec",
    "result_key",
]
