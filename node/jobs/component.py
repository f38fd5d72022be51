"""The job API of a running daemon: the job service, its routes and its status summary, made
in one place so the daemon adds them with one call."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from config import cuda_env, restricts_gpus
from health import CheckFn, CheckResult, HealthStatus
from node.component import Check, Endpoint, endpoints
from node.election.service import ElectionService
from node.jobs.drain import DrainKiller
from node.jobs.gang import GangService
from node.jobs.policy import rendezvous_env
from node.jobs.routes import JobRoutes
from node.jobs.service import JobService
from node.metrics import JobsCollector
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
    """The job service plus its HTTP routes, as the daemon holds them: a component whose
    `open()` opens the job store (re-attaching to running jobs) and watches the gangs."""

    def __init__(
        self,
        service: JobService,
        gangs: GangService,
        wal: WriteAheadLog | None = None,
        killer: DrainKiller | None = None,
    ) -> None:
        self.service = service
        self.gangs = gangs
        self._wal = wal
        self.killer = killer
        """Kills this node's jobs once a drain's kill_after_s passed (started by open())."""
        self._routes = JobRoutes(service, start=gangs.start)
        self._collector = JobsCollector(service.summary)

    async def open(self) -> None:
        """Open the job store and the gangs; on failure close both and re-raise."""
        if self._wal is None:
            raise ValueError("JobApi.open() needs the WAL: build it with job_api()")
        try:
            await self.service.open(self._wal, self.gangs.recovery())
            await self.gangs.open()
        except BaseException:
            await self.close()
            raise
        metrics = self.gangs.runtime.metrics
        if metrics is not None:
            metrics.registry.register(self._collector)
        if self.killer is not None:
            self.killer.start()

    def routes(self) -> list[Endpoint]:
        return endpoints(self.gangs, self._routes)

    def checks(self) -> Mapping[str, Check]:
        return {"jobs": Check(jobs_check(self.service), interval_s=5.0)}

    async def close(self) -> None:
        """Stop watching gangs and jobs; jobs keep running. Idempotent."""
        metrics = self.gangs.runtime.metrics
        if metrics is not None:
            with contextlib.suppress(KeyError):  # not registered: open() failed or a 2nd close
                metrics.registry.unregister(self._collector)
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


def job_api(
    runtime: NodeRuntime, election: ElectionService, wal: WriteAheadLog, secret: bytes | None
) -> JobApi:
    """The job component of a daemon (not opened yet)."""

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
    return JobApi(service, gangs, wal, DrainKiller(runtime.node_id, service, plan))


async def open_job_service(
    runtime: NodeRuntime, election: ElectionService, wal: WriteAheadLog, secret: bytes | None
) -> JobApi:
    """Open the job store (re-attaching to running jobs) and build the job routes; its check
    joins the node's health checks."""
    api = job_api(runtime, election, wal, secret)
    await api.open()
    if runtime.health is not None:
        for name, check in api.checks().items():
            runtime.health.add_check(name, check.fn, interval_s=check.interval_s)
    return api
