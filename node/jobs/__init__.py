"""Jobs: commands run on a node (or a gang of nodes) under a supervisor that outlives the
daemon, with durable logs, exact exit codes, kill, files and a WAL record of every start and
kill. The daemon side lives here; the client API is `node.jobs.client`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.errors import JobError
    from node.jobs.client import (
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
    from node.jobs.documents import JobRecordJson, JobRequestJson, JobSpecJson
    from node.jobs.gang import GangService
    from node.jobs.records import (
        GangMember,
        GangRecord,
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
    from node.providers import GPUQuery
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
