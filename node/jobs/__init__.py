"""Jobs: commands run on a node (or a gang of nodes) under a supervisor that outlives the
daemon, with durable logs, exact exit codes, kill, files and a WAL record of every start and
kill. The daemon side lives here; the client API is `node.jobs.api`."""

from __future__ import annotations

from node.jobs.gang import GangService
from node.jobs.http import JobRoutes, job_route_docs
from node.jobs.records import JobError, JobRequest, JobState, parse_job_request
from node.jobs.roster import gang_master_port, gang_outcome, pick_members
from node.jobs.service import JobService
from node.jobs.setup import JobApi, open_job_service
from node.jobs.store import JobEntry, JobStore

__all__ = [
    "GangService",
    "JobApi",
    "JobEntry",
    "JobError",
    "JobRequest",
    "JobRoutes",
    "JobService",
    "JobState",
    "JobStore",
    "gang_master_port",
    "gang_outcome",
    "job_route_docs",
    "open_job_service",
    "parse_job_request",
    "pick_members",
]

# --- client API (node.jobs.api, owned by the jobs client work): the integrator adds its
# --- imports and names here, below this line.
