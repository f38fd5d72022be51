"""The job context (fray's `JobContext`): put/get/run/wait and actors over the backends sync,
thread, process, shoal (workers across the cluster) and ray; cluster-level job submission."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.tasks.backends import ContextSpec, current_context, parse_spec
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
    from node.tasks.jobs import JobFailedError, JobHandle, JobRequest, ResourceConfig, place, submit
    from node.tasks.local import ProcessContext, SyncContext, ThreadContext
    from node.tasks.registry import ActorRecord, ActorRegistry, ActorRoutes, open_actor_routes
    from node.tasks.shoal import ShoalActor, ShoalContext
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.tasks.backends": "ContextSpec current_context parse_spec",
            "node.tasks.context": (
                "ActorDiedError ActorExistsError ActorHandle JobContext Ref RemoteTaskError "
                "RemoteTraceback TaskError TaskTimeout"
            ),
            "node.tasks.jobs": "JobFailedError JobHandle JobRequest ResourceConfig place submit",
            "node.tasks.local": "ProcessContext SyncContext ThreadContext",
            "node.tasks.registry": "ActorRecord ActorRegistry ActorRoutes open_actor_routes",
            "node.tasks.shoal": "ShoalActor ShoalContext",
        },
    )

__all__ = [
    "ActorDiedError",
    "ActorExistsError",
    "ActorHandle",
    "ActorRecord",
    "ActorRegistry",
    "ActorRoutes",
    "ContextSpec",
    "JobContext",
    "JobFailedError",
    "JobHandle",
    "JobRequest",
    "ProcessContext",
    "Ref",
    "RemoteTaskError",
    "RemoteTraceback",
    "ResourceConfig",
    "ShoalActor",
    "ShoalContext",
    "SyncContext",
    "TaskError",
    "TaskTimeout",
    "ThreadContext",
    "current_context",
    "open_actor_routes",
    "parse_spec",
    "place",
    "submit",
]
