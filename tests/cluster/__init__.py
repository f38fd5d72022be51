"""Multi-host test harness: shoal daemons as processes on namespace or loopback hosts."""

from __future__ import annotations

from tests.cluster.cluster import (
    Cluster,
    HarnessError,
    Host,
    LoopbackCluster,
    PartitionUnsupportedError,
    free_port,
)
from tests.cluster.fixtures import LoopbackClusterFactory, NetnsClusterFactory, require_netns
from tests.cluster.netns import NetnsCluster, netns_unavailable_reason, remove_stale_namespaces
from tests.cluster.process import ClusterProcess
from tests.cluster.waiting import WaitTimeoutError, async_wait_until, wait_until

__all__ = [
    "Cluster",
    "ClusterProcess",
    "HarnessError",
    "Host",
    "LoopbackCluster",
    "LoopbackClusterFactory",
    "NetnsCluster",
    "NetnsClusterFactory",
    "PartitionUnsupportedError",
    "WaitTimeoutError",
    "async_wait_until",
    "free_port",
    "netns_unavailable_reason",
    "remove_stale_namespaces",
    "require_netns",
    "wait_until",
]
