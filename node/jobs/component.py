"""The job API of a running daemon: the job service, its routes and its status summary, made
in one place so the daemon adds them with one call."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from config import cuda_env, restricts_gpus
from health import CheckFn, CheckResult, HealthStatus
from node.election.service import ElectionService
from node.jobs.drain import DrainKiller
from node.jobs.gang import GangService
from node.jobs.policy import rendezvous_env
from node.jobs.routes import JobRoutes, job_route_docs
from node.jobs.service import JobService
from node.openapi import RouteDoc
from node.plan import RolePlan
from node.runtime import NodeRuntime, local_daemon_url
from node.training.rendezvous import rendezvous_for
from wal import WriteAheadLog


def jobs_root(runtime: NodeRuntime) -> Path:
    return runtime.settings.data_dir / "jobs"


def jobs_check(service: JobService) -> CheckFn:
    """Degraded while the job files cannot be read (then ends of jobs go unnoticed)."""

    async def check() -> CheckResult:
        counts = service.summary()
        metrics = {"running": float(counts["running"]), "lost": float(counts["lost"])}
        if service.watch_error is not None:
            return CheckResult(HealthStatus.DEGRADED, service.watch_error, metrics)
        return CheckResult(HealthStatus.HEALTHY, f"{counts['running']} jobs running", metrics)

    return check


class JobApi:
    """The job service plus its HTTP routes, as the daemon holds them."""

    def __init__(
        self, service: JobService, gangs: GangService, killer: DrainKiller | None = None
    ) -> None:
        self.service = service
        self.gangs = gangs
        self.killer = killer
        self._routes = JobRoutes(service, start=gangs.start)

    def routes(self) -> list[web.RouteDef]:
        return [*self.gangs.routes(), *self._routes.routes()]

    @staticmethod
    def docs() -> list[RouteDoc]:
        return [*GangService.docs(), *job_route_docs()]

    async def close(self) -> None:
        """Stop watching gangs and jobs; jobs keep running. Idempotent."""
        if self.killer is not None:
            await self.killer.close()
        await self.gangs.close()
        await self.service.close()


def jobs_base_env(runtime: NodeRuntime, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment jobs start from: the daemon's, plus CUDA_VISIBLE_DEVICES (and
    CUDA_DEVICE_ORDER) for the GPUs this node owns when `gpus` lists them. A job's own `env`
    is applied over it, so a job may choose its GPUs itself."""
    env = dict(environ)
    if restricts_gpus(runtime.settings.gpus):
        env |= cuda_env(runtime.owned_gpus)
    return env


async def open_job_service(
    runtime: NodeRuntime, election: ElectionService, wal: WriteAheadLog, secret: bytes | None
) -> JobApi:
    """Open the job store (re-attaching to running jobs) and build the job routes."""

    def plan() -> RolePlan | None:
        elector = election.elector
        return elector.plan if elector is not None else None

    def node_rendezvous(inherited: Mapping[str, str]) -> dict[str, str]:
        rendezvous = rendezvous_for(plan(), runtime.node_id)
        return rendezvous_env(None if rendezvous is None else rendezvous.to_dict(), inherited)

    service = JobService(
        runtime.node_id,
        runtime.settings.jobs,
        jobs_root(runtime),
        daemon_url=lambda: local_daemon_url(runtime),
        rendezvous_env=node_rendezvous,
        base_env=jobs_base_env(runtime, os.environ),
    )
    gangs = GangService(runtime, service, plan, secret)
    try:
        await service.open(wal, gangs.recovery())
        await gangs.open()
    except BaseException:
        await gangs.close()
        await service.close()
        raise
    runtime.jobs = service.summary
    if runtime.health is not None:
        runtime.health.add_check("jobs", jobs_check(service), interval_s=5.0)
    killer = DrainKiller(runtime.node_id, service, plan)
    killer.start()
    return JobApi(service, gangs, killer)
