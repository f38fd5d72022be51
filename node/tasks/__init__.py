"""The job context (fray's `JobContext`): put/get/run/wait and actors over the backends sync,
thread, process, shoal (workers across the cluster) and ray; cluster-level job submission."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.errors import (
        ActorDiedError,
        ActorExistsError,
        JobFailedError,
        RemoteTaskError,
        RemoteTraceback,
        TaskError,
        TaskTimeout,
    )
    from node.tasks.backends import ContextSpec, current_context, parse_spec
    from node.tasks.context import ActorHandle, JobContext, Ref
    from node.tasks.jobs import JobHandle, JobRequest, ResourceConfig, place, submit
    from node.tasks.local import ProcessContext, SyncContext, ThreadContext
    from node.tasks.registry import ActorRecord, ActorRegistry, ActorRoutes, open_actor_routes
    from node.tasks.shoal import ShoalActor, ShoalContext
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
