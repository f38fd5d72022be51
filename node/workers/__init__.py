"""Miniray-style workers: forked local workers and authenticated remote ones speaking
length-prefixed JSON frames, worker servers started as shoal jobs across a cluster, and their
NCCL settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.workers.auth import load_secret
    from node.workers.cluster import Cluster, NodeConfig, listening_port, nodes_of_plan
    from node.workers.frames import (
        Frame,
        FrameError,
        WorkerAuthError,
        WorkerClosed,
        WorkerDied,
        WorkerError,
        WorkerTimeout,
    )
    from node.workers.local import Worker, WorkerBase, WorkerHandle, wait_any
    from node.workers.nccl import NCCLConfig, create_nccl_configs, setup_nccl_env
    from node.workers.remote import RemoteWorker
    from node.workers.server import WorkerServer, authenticate, load_work_fn
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.workers.auth": "load_secret",
            "node.workers.cluster": "Cluster NodeConfig listening_port nodes_of_plan",
            "node.workers.frames": (
                "Frame FrameError WorkerAuthError WorkerClosed WorkerDied WorkerError WorkerTimeout"
            ),
            "node.workers.local": "Worker WorkerBase WorkerHandle wait_any",
            "node.workers.nccl": "NCCLConfig create_nccl_configs setup_nccl_env",
            "node.workers.remote": "RemoteWorker",
            "node.workers.server": "WorkerServer authenticate load_work_fn",
        },
    )

__all__ = [
    "Cluster",
    "Frame",
    "FrameError",
    "NCCLConfig",
    "NodeConfig",
    "RemoteWorker",
    "Worker",
    "WorkerAuthError",
    "WorkerBase",
    "WorkerClosed",
    "WorkerDied",
    "WorkerError",
    "WorkerHandle",
    "WorkerServer",
    "WorkerTimeout",
    "authenticate",
    "create_nccl_configs",
    "listening_port",
    "load_secret",
    "load_work_fn",
    "nodes_of_plan",
    "setup_nccl_env",
    "wait_any",
]
