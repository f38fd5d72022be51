"""The job context (fray's `JobContext`): put/get/run/wait and actors over the backends sync,
thread, process, shoal (workers across the cluster) and ray; cluster-level job submission."""

from __future__ import annotations

from node.tasks.context import (
    ActorDiedError,
    ActorExistsError,
    ActorHandle,
    JobContext,
    Ref,
    RemoteTaskError,
    RemoteTraceback,
    TaskError,
    TaskTimeout,
)
from node.tasks.local import ProcessContext, SyncContext, ThreadContext

__all__ = [
    "ActorDiedError",
    "ActorExistsError",
    "ActorHandle",
    "JobContext",
    "ProcessContext",
    "Ref",
    "RemoteTaskError",
    "RemoteTraceback",
    "SyncContext",
    "TaskError",
    "TaskTimeout",
    "ThreadContext",
]
