"""What each topic of the dashboard's event stream shows, read from the daemon's own state.

Every function here reads what a component already keeps (the membership view, the plan, the
job store, sync progress, the weights and rollout state, the lock table, the health registry);
none of them starts, stops or changes anything.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from node.api import status_document
from node.election.plan import RolePlan
from node.jobs.service import JobService
from node.rl.backlog import RolloutBacklog
from node.rl.service import WeightsService
from node.runs.locks import LockService
from node.runtime import NodeRuntime
from node.sync_service import SyncService

MAX_JOBS_SHOWN = 200
"""The newest jobs the `jobs` topic lists (the page filters among them)."""
STALE_DROPS_METRIC = "shoal_rollouts_dropped_stale_total"

TopicFn = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class UiSources:
    """The daemon's components the dashboard reads; None where a component is absent."""

    runtime: NodeRuntime
    plan: Callable[[], RolePlan | None]
    jobs: JobService | None = None
    sync: SyncService | None = None
    weights: WeightsService | None = None
    backlog: RolloutBacklog | None = None
    locks: LockService | None = None


def member_rows(sources: UiSources) -> list[dict[str, Any]]:
    """One row per member of the view: state, role and training rank from the plan, GPUs."""
    membership = sources.runtime.membership
    plan = sources.plan()
    ranks = {} if plan is None else {node: i for i, node in enumerate(plan.training_ranks)}
    rows = []
    for member in [] if membership is None else membership.members():
        meta = dict(member.meta)
        planned = None if plan is None else plan.roles.get(member.node_id)
        rows.append(
            {
                "node_id": member.node_id,
                "address": f"{member.address}:{member.port}",
                "state": str(member.state),
                "incarnation": member.incarnation,
                "last_seen_s": round(member.last_seen_s, 1),
                "role": str(planned) if planned is not None else meta.get("role"),
                "rank": ranks.get(member.node_id),
                "version": meta.get("version"),
                "gpus": meta.get("gpu_count", 0),
                "gpu": meta.get("gpu"),
                "config_hash": meta.get("config_hash"),
                "is_self": bool(getattr(member, "is_self", False)),
            }
        )
    return sorted(rows, key=lambda row: row["node_id"])


async def members_topic(sources: UiSources) -> dict[str, Any]:
    plan = sources.plan()
    return {
        "members": member_rows(sources),
        "plan": None
        if plan is None
        else {"term": plan.term, "version": plan.version, "note": plan.note},
    }


async def status_topic(sources: UiSources) -> dict[str, Any]:
    document = await status_document(sources.runtime)
    document.pop("uptime_s", None)  # changes every second; the page counts it from started_at
    return document


async def jobs_topic(sources: UiSources) -> dict[str, Any]:
    service = sources.jobs
    if service is None:
        return {"summary": {}, "jobs": []}
    entries = service.entries()[:MAX_JOBS_SHOWN]
    return {"summary": service.summary(), "jobs": [service.record(e) for e in entries]}


async def sync_topic(sources: UiSources) -> dict[str, Any]:
    return {} if sources.sync is None else sources.sync.status()


def _stale_drops(runtime: NodeRuntime) -> float | None:
    registry = None if runtime.metrics is None else runtime.metrics.registry
    return None if registry is None else registry.get_sample_value(STALE_DROPS_METRIC)


async def rl_topic(sources: UiSources) -> dict[str, Any]:
    runs: dict[str, dict[str, Any]] = {}
    if sources.weights is not None:
        for run, state in sorted(sources.weights.runs().items()):
            runs[run] = {
                "offered_version": state.offered_version,
                "applied_version": state.applied_version,
                "applied": state.status,
            }
    if sources.backlog is not None:
        for run, backlog in sorted(sources.backlog.runs().items()):
            runs.setdefault(run, {}).update(
                pending=backlog.pending + backlog.inflight,
                max_pending=sources.backlog.max_pending,
                refusing=backlog.refusing,
            )
    return {"runs": runs, "stale_drops": _stale_drops(sources.runtime)}


async def runs_topic(sources: UiSources) -> dict[str, Any]:
    if sources.locks is None:
        return {"locks": {}, "runs": {}}
    table = sources.locks.table.to_dict()
    queue = sorted(table["runs"].values(), key=lambda run: int(run.get("seq", 0)))
    return {
        "coordinator": sources.runtime.coordinator,
        "version": table["version"],
        "locks": table["locks"],
        "runs": queue,
    }


async def node_topic(sources: UiSources) -> dict[str, Any]:
    runtime = sources.runtime
    summary = None if runtime.health is None else runtime.health.summary()
    wal = None if runtime.wal is None else await runtime.wal.stats()
    return {
        "node_id": runtime.node_id,
        "health": None if summary is None else summary.to_dict(),
        "breakers": [
            {
                "peer": snap.peer,
                "transport": snap.transport,
                "state": snap.state.value,
                "failures": snap.consecutive_failures,
                "retry_after_s": snap.retry_after_s,
            }
            for snap in runtime.breakers.all_breakers()
        ],
        "wal": None
        if wal is None
        else {"pending": wal.pending, "oldest_pending_age_s": wal.oldest_pending_age_s},
    }


def topic_functions(sources: UiSources) -> dict[str, TopicFn]:
    """Every topic of the event stream but the per-job `log:ID` ones, by name."""
    makers: Mapping[str, Callable[[UiSources], Awaitable[Any]]] = {
        "status": status_topic,
        "members": members_topic,
        "jobs": jobs_topic,
        "sync": sync_topic,
        "rl": rl_topic,
        "runs": runs_topic,
        "node": node_topic,
    }
    return {name: _bind(maker, sources) for name, maker in makers.items()}


def _bind(maker: Callable[[UiSources], Awaitable[Any]], sources: UiSources) -> TopicFn:
    return lambda: maker(sources)


class NodeSampler:
    """One sample of this node's vital numbers for the sparklines (CPU of the process since the
    last sample, memory, WAL pending, alive members, running jobs, sync bytes done)."""

    def __init__(self, sources: UiSources) -> None:
        self._sources = sources
        self._last = (time.monotonic(), time.process_time())

    async def sample(self) -> dict[str, float]:
        sources = self._sources
        runtime = sources.runtime
        now, cpu = time.monotonic(), time.process_time()
        then, cpu_then = self._last
        self._last = (now, cpu)
        wal = None if runtime.wal is None else await runtime.wal.stats()
        counts = {} if runtime.membership is None else runtime.membership.counts()
        jobs = {} if sources.jobs is None else sources.jobs.summary()
        progress = None if sources.sync is None else sources.sync.status()["progress"]
        return {
            "t": round(time.time(), 1),
            "cpu_percent": round(100.0 * (cpu - cpu_then) / max(now - then, 1e-6), 1),
            "rss_mb": round(_rss_bytes() / 2**20, 1),
            "wal_pending": float(0 if wal is None else wal.pending),
            "alive": float(counts.get("alive", 0)),
            "jobs_running": float(jobs.get("running", 0)),
            "sync_bytes_done": float(0 if not progress else progress["bytes_done"]),
        }


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
