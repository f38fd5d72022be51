"""Jobs: commands run on a node (or a gang of nodes) under a supervisor that outlives the
daemon, with durable logs, exact exit codes, kill, files and a WAL record of every start and
kill. The daemon side lives here; the client API is `node.jobs.client`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.jobs.client import (
        GPUQuery,
        attach_job,
        attach_job_async,
        download,
        download_async,
        list_jobs,
        list_jobs_async,
        poll_status,
        poll_status_async,
        remove_job,
        remove_job_async,
        run_job,
        run_job_async,
        start_job,
        start_job_async,
        stream_logs,
        stream_logs_async,
        terminate,
        terminate_async,
        wait_for_completion,
        wait_for_completion_async,
    )
    from node.jobs.component import JobApi, open_job_service
    from node.jobs.gang import GangService
    from node.jobs.records import (
        GangMember,
        GangRecord,
        JobError,
        JobRecord,
        JobRequest,
        JobState,
        parse_job_request,
    )
    from node.jobs.roster import gang_master_port, gang_outcome, pick_members
    from node.jobs.routes import JobRoutes
    from node.jobs.service import JobService
    from node.jobs.specs import DeploySpec, JobSpec, make_job_state
    from node.jobs.store import JobEntry, JobStore
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.jobs.client": (
                "GPUQuery attach_job attach_job_async download download_async "
                "list_jobs list_jobs_async poll_status poll_status_async remove_job "
                "remove_job_async run_job run_job_async start_job start_job_async stream_logs "
                "stream_logs_async terminate terminate_async wait_for_completion "
                "wait_for_completion_async"
            ),
            "node.jobs.gang": "GangService",
            "node.jobs.routes": "JobRoutes",
            "node.jobs.records": (
                "GangMember GangRecord JobError JobRecord JobRequest JobState parse_job_request"
            ),
            "node.jobs.roster": "gang_master_port gang_outcome pick_members",
            "node.jobs.service": "JobService",
            "node.jobs.component": "JobApi open_job_service",
            "node.jobs.store": "JobEntry JobStore",
            "node.jobs.specs": "DeploySpec JobSpec make_job_state",
        },
    )

__all__ = [
    "DeploySpec",
    "GPUQuery",
    "GangMember",
    "GangRecord",
    "GangService",
    "JobApi",
    "JobEntry",
    "JobError",
    "JobRecord",
    "JobRequest",
    "JobRoutes",
    "JobService",
    "JobSpec",
    "JobState",
    "JobStore",
    "attach_job",
    "attach_job_async",
    "download",
    "download_async",
    "gang_master_port",
    "gang_outcome",
    "list_jobs",
    "list_jobs_async",
    "make_job_state",
    "open_job_service",
    "parse_job_request",
    "pick_members",
    "poll_status",
    "poll_status_async",
    "remove_job",
    "remove_job_async",
    "run_job",
    "run_job_async",
    "start_job",
    "start_job_async",
    "stream_logs",
    "stream_logs_async",
    "terminate",
    "terminate_async",
    "wait_for_completion",
    "wait_for_completion_async",
]
