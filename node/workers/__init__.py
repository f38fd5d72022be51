"""Miniray-style workers: forked local workers and authenticated remote ones speaking
length-prefixed JSON frames, worker servers started as shoal jobs across a cluster, and their
NCCL settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.errors import (
        FrameError,
        WorkerAuthError,
        WorkerClosed,
        WorkerDied,
        WorkerError,
        WorkerTimeout,
    )
    from node.workers.auth import load_secret
    from node.workers.cluster import Cluster, NodeConfig, listening_port, nodes_of_plan
    from node.workers.frames import Frame
    from node.workers.local import Worker, WorkerBase, WorkerHandle, wait_any
    from node.workers.nccl import NCCLConfig, create_nccl_configs, setup_nccl_env
    from node.workers.remote import RemoteWorker
    from node.workers.server import WorkerServer, authenticate, load_work_fn
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
