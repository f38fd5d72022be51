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

from health.gpu import GpuInfo
from health.monitor.model import NodeStatusDoc, parse_status
from node.identity.peers import peer_tls
from node.jobs.service import JobService
from node.locks.service import LockService
from node.plan import RolePlan
from node.rl.backlog import RolloutBacklog
from node.rl.service import WeightsService
from node.routes import NO_STATUS_PARTS, status_document
from node.runtime import NodeRuntime, StatusParts
from node.sync_routes import SyncStatusJson
from node.sync_service import SyncService
from node.ui.documents import (
    AppliedWeights,
    GpuRow,
    JobsTopic,
    MemberRow,
    MembersTopic,
    NodeTopic,
    NodeWeights,
    RlTopic,
    RunsTopic,
    RunWeightsRow,
)
from node.ui.peers import Applied, Known, Peer, PeerClient, PeerFanout, ask_status, ask_weights
from node.ui.training import TrainingSource, quarantine_rows, training_topics

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
    secret: bytes | None = None
    """The cluster secret: the dashboard's GETs to other members are signed with it."""
    training: TrainingSource | None = None
    """The training group's progress and history (node.training)."""
    status: StatusParts = NO_STATUS_PARTS
    """The status document's parts other components own (jobs, auto-stop, training)."""


class ClusterPeers:
    """The other members' status documents and weights, asked by the cluster and RL topics
    (node.ui.peers: at most once per `interval_s`, each member within the timeout table's
    `peer_status_s`, only while a page reads the topic). `close()` cancels asks in flight."""

    def __init__(self, sources: UiSources, interval_s: float) -> None:
        runtime = sources.runtime
        self._sources = sources
        self._client = PeerClient(
            sources.secret, runtime.node_id, runtime.settings.cluster_name, tls=peer_tls(runtime)
        )
        timeout_s = runtime.settings.timeouts.peer_status_s
        client = self._client
        self.status: PeerFanout[NodeStatusDoc] = PeerFanout(
            lambda peer: ask_status(client, peer), interval_s=interval_s, timeout_s=timeout_s
        )
        self.weights: PeerFanout[dict[str, Applied]] = PeerFanout(
            lambda peer: ask_weights(client, peer, self.runs()),
            interval_s=interval_s,
            timeout_s=timeout_s,
        )

    def runs(self) -> list[str]:
        """The runs this node knows (weights offered or applied here, rollouts stored here):
        the runs a member of an older release, without /v1/weights/runs, is asked about."""
        sources = self._sources
        names = set() if sources.weights is None else set(sources.weights.runs())
        if sources.backlog is not None:
            names |= set(sources.backlog.runs())
        return sorted(names)

    def alive_peers(self) -> list[Peer]:
        """Every alive member of the view but this node."""
        runtime = self._sources.runtime
        members = [] if runtime.membership is None else runtime.membership.members()
        return [
            Peer(member.node_id, member.address, member.port)
            for member in members
            if str(member.state) == "alive"
            and member.node_id != runtime.node_id
            and not getattr(member, "is_self", False)
        ]

    def member_ids(self) -> list[str]:
        membership = self._sources.runtime.membership
        return [] if membership is None else [m.node_id for m in membership.members()]

    async def close(self) -> None:
        await self.status.close()
        await self.weights.close()
        await self._client.close()


def _gpu_row(gpu: GpuInfo) -> GpuRow:
    problems = list(gpu.problems) or list(gpu.faults)
    return {
        "index": gpu.index,
        "name": gpu.name,
        "util_pct": gpu.util_pct,
        "memory_used_mb": gpu.memory_used_mb,
        "memory_total_mb": gpu.memory_total_mb,
        "temperature_c": gpu.temperature_c,
        "healthy": not gpu.error and not problems,
        "problems": problems,
    }


def member_rows(
    sources: UiSources, statuses: Mapping[str, Known[NodeStatusDoc]] | None = None
) -> list[MemberRow]:
    """One row per member of the view: state, role and training rank from the plan, and from
    the member's own /v1/status (`statuses`, by node id) its release, role, GPUs with health
    and health problems; `drain` ({"kill_after_s"}) while the plan drains it, else None;
    `quarantine` the reason while the plan quarantines it for a GPU fault, else None;
    `stale` when its last status is older than its last ask (the ask failed, or it is not alive
    so not asked), with `status_error` saying why; `refused` why this node refuses it (a
    revoked certificate), else None."""
    membership = sources.runtime.membership
    plan = sources.plan()
    ranks = {} if plan is None else {node: i for i, node in enumerate(plan.training_ranks)}
    statuses = statuses or {}
    rows: list[MemberRow] = []
    for member in [] if membership is None else membership.members():
        meta = dict(member.meta)
        planned = None if plan is None else plan.roles.get(member.node_id)
        state = str(member.state)
        known = statuses.get(member.node_id, Known[NodeStatusDoc]())
        doc = known.value
        error = known.error
        if error is None and state != "alive" and doc is not None:
            error = f"not asked: the member is {state}"
        gpus = None if doc is None else [_gpu_row(gpu) for gpu in doc.gpus]
        rows.append(
            {
                "node_id": member.node_id,
                "address": f"{member.address}:{member.port}",
                "state": state,
                "refused": getattr(member, "refused", None),
                "incarnation": member.incarnation,
                "last_seen_s": round(member.last_seen_s, 1),
                "role": str(planned)
                if planned is not None
                else (doc.role if doc is not None and doc.role else meta.get("role")),
                "rank": ranks.get(member.node_id),
                "drain": None
                if plan is None or not plan.is_draining(member.node_id)
                else {"kill_after_s": plan.draining[member.node_id]},
                "quarantine": None if plan is None else plan.quarantined.get(member.node_id),
                "version": doc.version if doc is not None and doc.version else meta.get("version"),
                "gpus": len(gpus) if gpus is not None else meta.get("gpu_count", 0),
                "gpu": gpus[0]["name"] if gpus else meta.get("gpu"),
                "gpu_list": gpus,
                "health": None if doc is None else doc.health,
                "health_problems": [] if doc is None else list(doc.health_problems),
                "status_at": known.answered_at,
                "stale": error is not None,
                "status_error": error,
                "config_hash": meta.get("config_hash"),
                "is_self": bool(getattr(member, "is_self", False)),
            }
        )
    return sorted(rows, key=lambda row: row["node_id"])


async def members_topic(sources: UiSources, peers: ClusterPeers | None = None) -> MembersTopic:
    """Every member's row; starts a round of asking the other members when one is due."""
    plan = sources.plan()
    statuses: dict[str, Known[NodeStatusDoc]] = {}
    if peers is not None:
        statuses = peers.status.latest(peers.alive_peers(), keep=peers.member_ids())
    runtime = sources.runtime
    statuses[runtime.node_id] = Known(
        parse_status(await status_document(runtime, sources.status)), round(time.time(), 1), None
    )
    return {
        "members": member_rows(sources, statuses),
        "plan": None
        if plan is None
        else {
            "term": plan.term,
            "version": plan.version,
            "note": plan.note,
            "draining": dict(plan.draining),
            "quarantined": dict(plan.quarantined),
        },
    }


def gpu_quarantine(sources: UiSources) -> list[dict[str, Any]]:
    """The training page's GPU quarantine: the plan's quarantined nodes, with the lock table's
    records as this node holds them (node.ui.training.quarantine_rows)."""
    plan = sources.plan()
    records = {} if sources.locks is None else sources.locks.table.quarantines
    return quarantine_rows({} if plan is None else plan.quarantined, records)


async def status_topic(sources: UiSources) -> dict[str, Any]:
    document = await status_document(sources.runtime, sources.status)
    document.pop("uptime_s", None)  # changes every second; the page counts it from started_at
    return document


async def jobs_topic(sources: UiSources) -> JobsTopic:
    service = sources.jobs
    if service is None:
        return {"summary": {}, "jobs": []}
    entries = service.entries()[:MAX_JOBS_SHOWN]
    return {"summary": service.summary(), "jobs": [service.record(e).to_json() for e in entries]}


async def sync_topic(sources: UiSources) -> SyncStatusJson | dict[str, object]:
    return {} if sources.sync is None else sources.sync.status()


def _stale_drops(runtime: NodeRuntime) -> float | None:
    registry = None if runtime.metrics is None else runtime.metrics.registry
    return None if registry is None else registry.get_sample_value(STALE_DROPS_METRIC)


async def rl_topic(sources: UiSources, peers: ClusterPeers | None = None) -> RlTopic:
    """This node's runs (offered and applied versions, rollouts pending), staleness drops,
    `cluster_runs`: every run this node or an alive member knows (each member answers its own,
    asked once per interval), and per node the weights applied of each of them (`nodes`)."""
    runs: dict[str, RunWeightsRow] = {}
    here: dict[str, AppliedWeights | None] = {}
    if sources.weights is not None:
        for run, state in sorted(sources.weights.runs().items()):
            runs[run] = {
                "offered_version": state.offered_version,
                "applied_version": state.applied_version,
                "applied": None if state.status is None else state.status.to_json(),
            }
            status = state.status
            here[run] = None if status is None else {
                "version": status.version,
                "applied_at": status.applied_at,
                "source": status.source,
            }  # fmt: skip
    if sources.backlog is not None:
        for run, backlog in sorted(sources.backlog.runs().items()):
            row = runs.setdefault(run, {})
            row["pending"] = backlog.pending + backlog.inflight
            row["max_pending"] = sources.backlog.max_pending
            row["refusing"] = backlog.refusing
    names = set(runs)
    answers: dict[str, Known[dict[str, Applied]]] = {}
    if peers is not None:
        answers = peers.weights.latest(peers.alive_peers(), keep=peers.member_ids())
        for entry in answers.values():
            names |= set(entry.value or {})
    cluster_runs = sorted(names)
    nodes: dict[str, NodeWeights] = {
        sources.runtime.node_id: {
            "runs": {run: here.get(run) for run in cluster_runs},
            "answered_at": None,
            "stale": False,
            "error": None,
        }
    }
    for node_id, entry in sorted(answers.items()):
        answered = entry.value or {}
        nodes[node_id] = {
            "runs": {run: answered.get(run) for run in cluster_runs},
            "answered_at": entry.answered_at,
            "stale": entry.stale or entry.value is None,
            "error": entry.error,
        }
    return {
        "runs": runs,
        "cluster_runs": cluster_runs,
        "stale_drops": _stale_drops(sources.runtime),
        "nodes": nodes,
    }


async def runs_topic(sources: UiSources) -> RunsTopic:
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


async def node_topic(sources: UiSources) -> NodeTopic:
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


def topic_functions(sources: UiSources, peers: ClusterPeers | None = None) -> dict[str, TopicFn]:
    """Every topic of the event stream but the per-job `log:ID` ones, by name; `members` and
    `rl` ask the other members through `peers` (None: this node's own data only)."""
    makers: Mapping[str, Callable[[UiSources], Awaitable[Any]]] = {
        "status": status_topic,
        "jobs": jobs_topic,
        "sync": sync_topic,
        "runs": runs_topic,
        "node": node_topic,
    }
    topics = {name: _bind(maker, sources) for name, maker in makers.items()}
    topics["members"] = lambda: members_topic(sources, peers)
    topics["rl"] = lambda: rl_topic(sources, peers)
    topics.update(training_topics(sources.training, lambda: gpu_quarantine(sources)))
    return topics


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
