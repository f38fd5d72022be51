"""The weights control plane of one daemon: update offers from the trainer's publisher, the
long poll its receiver process waits on, applied reports, status, metrics and the WAL record.
Its routes (node.rl.routes): POST /v1/weights/update, GET /v1/weights/next, POST
/v1/weights/applied, GET /v1/weights/status, GET /v1/weights/runs and the weights group of
GET /v1/rendezvous.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

from node.errors import AnsweredError
from node.plan import RolePlan
from node.rl.group import WeightsRendezvous, weights_rendezvous_for
from node.rl.offers import OfferTaken, WeightsOffer, WeightsRuns, WeightsStatus
from wal import WriteAheadLog

log = logging.getLogger(__name__)

SOURCES = ("broadcast", "file")
WAL_ENTRY = "rl.weights_applied"
UPDATE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class RunWeights:
    """What one node knows of one run: the newest offer and the weights applied here."""

    offered: WeightsOffer | None = None
    status: WeightsStatus | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def offered_version(self) -> int:
        return -1 if self.offered is None else self.offered.version

    @property
    def applied_version(self) -> int:
        return -1 if self.status is None else self.status.version

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class WeightsService:
    """Per-run weights state of this node, served over HTTP. `plan_of` answers the applied plan;
    `url_of` a member's daemon URL."""

    def __init__(
        self,
        node_id: str,
        plan_of: Callable[[], RolePlan | None],
        url_of: Callable[[str], str | None],
        wal: WriteAheadLog | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self._plan_of = plan_of
        self._url_of = url_of
        self._wal = wal
        self._clock = clock
        self._runs: dict[str, RunWeights] = {}
        self.version_gauge = Gauge(
            "shoal_weights_version",
            "Version of the policy weights applied on this node, by run.",
            ["run"],
            registry=registry,
        )
        self.update_seconds = Histogram(
            "shoal_weights_update_seconds",
            "Time from the trainer sending a weights update to this node applying it.",
            buckets=UPDATE_BUCKETS_S,
            registry=registry,
        )

    def plan(self) -> RolePlan | None:
        """The role plan this node applies, or None before it applies one."""
        return self._plan_of()

    def rendezvous_of(self, run: str) -> WeightsRendezvous | None:
        """This node's view of the weights group of `run`; None before a plan is applied."""
        return weights_rendezvous_for(self._plan_of(), self.node_id, run, self._url_of)

    def state(self, run: str) -> RunWeights:
        return self._runs.setdefault(run, RunWeights())

    def runs(self) -> dict[str, RunWeights]:
        """Every run this node knows of, by name (a copy of the mapping)."""
        return dict(self._runs)

    def offer(self, offer: WeightsOffer) -> OfferTaken:
        """Take `offer` as its run's newest and wake the run's long polls. Raises AnsweredError
        409 `old_version` unless its version is newer than every version offered or applied."""
        state = self.state(offer.run)
        newest = max(state.offered_version, state.applied_version)
        if offer.version <= newest:
            raise AnsweredError(
                409,
                "old_version",
                f"run {offer.run!r}: version {offer.version} is not newer than {newest}; "
                "versions strictly increase per run",
            )
        state.offered = offer
        state.wake()
        return OfferTaken(run=offer.run, version=offer.version)

    async def next_offer(self, run: str, after: int, timeout_s: float) -> WeightsOffer | None:
        """The run's offer once its version is above `after`, waiting at most `timeout_s`;
        None when none came."""
        state = self.state(run)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while state.offered_version <= after:
            left_s = deadline - asyncio.get_running_loop().time()
            if left_s <= 0:
                return None
            try:
                await asyncio.wait_for(state.changed.wait(), left_s)
            except TimeoutError:
                return None
        return state.offered

    async def applied(self, report: Mapping[str, Any]) -> WeightsStatus:
        """Record the weights a local process applied or published (AppliedBody.normalized()):
        in the WAL first (when there is one), then the run's status, gauge and update time.
        Raises AnsweredError 409 `old_version` for a version older than the applied one."""
        state = self.state(report["run"])
        if report["version"] < state.applied_version:
            raise AnsweredError(
                409,
                "old_version",
                f"run {report['run']!r}: version {report['version']} is older than the applied "
                f"{state.applied_version}",
            )
        now = self._clock()
        status = WeightsStatus.model_validate(
            {
                "run": report["run"],
                "version": report["version"],
                "digest": report["digest"],
                "sha256": report.get("sha256"),
                "applied_at": now,
                "source": report["source"],
                "bytes": report["bytes"],
            }
        )
        if self._wal is not None:
            payload = {**status.to_json(), "receivers": report["receivers"]}
            payload["node"] = self.node_id
            entry = await self._wal.append(WAL_ENTRY, payload)
            await self._wal.commit(entry)
        state.status = status
        self.version_gauge.labels(run=report["run"]).set(report["version"])
        if report["sent_at"] is not None:
            self.update_seconds.observe(max(0.0, now - report["sent_at"]))
        state.wake()
        return status

    def status_of(self, run: str) -> WeightsStatus | None:
        """The weights applied here for `run`, or None (an unknown run is not remembered)."""
        known = self._runs.get(run)
        return None if known is None else known.status

    def applied_runs(self) -> WeightsRuns:
        """Every run this node knows, by name, each with its applied weights or None."""
        return WeightsRuns(runs={run: state.status for run, state in sorted(self._runs.items())})
