"""The weights control plane of one daemon: update offers from the trainer's publisher, the
long poll its receiver process waits on, applied reports, status, metrics and the WAL record.

Routes: POST /v1/weights/update (fenced by the plan), GET /v1/weights/next, POST
/v1/weights/applied, GET /v1/weights/status, and the weights group for GET /v1/rendezvous.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram

from node.component import Endpoint, paired
from node.errors import BodyError, NodeError
from node.openapi import RouteDoc, parse_body
from node.plan import FENCE_HEADER, PlanError, PlanFence, RolePlan, check_fence
from node.rl.docs import (
    DEFAULT_POLL_S,
    MAX_POLL_S,
    RUN_PATTERN,
    AppliedBody,
    OfferBody,
    weights_route_docs,
)
from node.rl.group import weights_rendezvous_for
from node.rl.offers import OfferTaken, WeightsOffer, WeightsRuns, WeightsStatus
from node.security import json_error
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


class _BadRequest(NodeError):
    def __init__(self, reason: str, param: str) -> None:
        super().__init__(reason)
        self.reason, self.param = reason, param


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

    def routes(self) -> list[Endpoint]:
        served = [
            web.post("/v1/weights/update", self._update),
            web.get("/v1/weights/next", self._next),
            web.post("/v1/weights/applied", self._applied),
            web.get("/v1/weights/status", self._status),
            web.get("/v1/weights/runs", self._runs_status),
        ]
        return paired(served, self.docs())

    @staticmethod
    def docs() -> list[RouteDoc]:
        return weights_route_docs()

    async def rendezvous(self, request: web.Request) -> web.Response:
        """GET /v1/rendezvous?group=weights&run=R: this node's view of the run's weights group."""
        try:
            run = _run(request.query.get("run", ""))
        except _BadRequest as exc:
            return json_error(400, exc.reason, param=exc.param)
        found = weights_rendezvous_for(self._plan_of(), self.node_id, run, self._url_of)
        if found is None:
            return json_error(409, "no role plan yet: no coordinator has published one")
        return web.json_response(found.to_dict())

    def state(self, run: str) -> RunWeights:
        return self._runs.setdefault(run, RunWeights())

    def runs(self) -> dict[str, RunWeights]:
        """Every run this node knows of, by name (a copy of the mapping)."""
        return dict(self._runs)

    async def _update(self, request: web.Request) -> web.Response:
        plan = self._plan_of()
        try:
            presented = request.headers.get(FENCE_HEADER)
            fence = None if presented is None else PlanFence.from_header(presented)
        except PlanError as exc:
            return json_error(400, str(exc), param=FENCE_HEADER)
        verdict = check_fence(None if plan is None else plan.fence, fence)
        if not verdict.ok:
            return json_error(409, verdict.reason, code="stale_fence", fence=verdict.to_dict())
        try:
            body = parse_body(OfferBody, await request.read())
        except BodyError as exc:
            return json_error(400, exc.reason, param=_param(exc))
        offer = WeightsOffer.model_validate(body.normalized())
        state = self.state(offer.run)
        newest = max(state.offered_version, state.applied_version)
        if offer.version <= newest:
            return json_error(
                409,
                f"run {offer.run!r}: version {offer.version} is not newer than {newest}; "
                "versions strictly increase per run",
                code="old_version",
            )
        state.offered = offer
        state.wake()
        return web.json_response(OfferTaken(run=offer.run, version=offer.version).to_json())

    async def _next(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            _known_query(query, ("run", "after", "timeout_s"))
            run = _run(query.get("run", ""))
            after = _int(query.get("after", "-1"), "after", minimum=-1)
            timeout_s = _float(query.get("timeout_s", str(DEFAULT_POLL_S)), "timeout_s")
            if timeout_s > MAX_POLL_S:
                raise _BadRequest(
                    f"timeout_s {timeout_s:g} must be at most {MAX_POLL_S:g}", "timeout_s"
                )
        except _BadRequest as exc:
            return json_error(400, exc.reason, param=exc.param)
        state = self.state(run)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while state.offered_version <= after:
            left_s = deadline - asyncio.get_running_loop().time()
            if left_s <= 0:
                return web.Response(status=204)
            try:
                await asyncio.wait_for(state.changed.wait(), left_s)
            except TimeoutError:
                return web.Response(status=204)
        assert state.offered is not None
        return web.json_response(state.offered.to_json())

    async def _applied(self, request: web.Request) -> web.Response:
        try:
            report = parse_body(AppliedBody, await request.read()).normalized()
        except BodyError as exc:
            return json_error(400, exc.reason, param=_param(exc))
        state = self.state(report["run"])
        if report["version"] < state.applied_version:
            return json_error(
                409,
                f"run {report['run']!r}: version {report['version']} is older than the applied "
                f"{state.applied_version}",
                code="old_version",
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
        return web.json_response(status.to_json())

    async def _runs_status(self, request: web.Request) -> web.Response:
        runs = {run: state.status for run, state in sorted(self._runs.items())}
        return web.json_response(WeightsRuns(runs=runs).to_json())

    async def _status(self, request: web.Request) -> web.Response:
        try:
            _known_query(request.query, ("run",))
            run = _run(request.query.get("run", ""))
        except _BadRequest as exc:
            return json_error(400, exc.reason, param=exc.param)
        status = self._runs.get(run, RunWeights()).status
        if status is None:
            return json_error(
                404, f"run {run!r} has no weights on this node yet", code="no_weights"
            )
        return web.json_response(status.to_json())


def _param(error: BodyError) -> str:
    """The top-level field a BodyError names ("body" for the whole)."""
    return error.field.split(".", 1)[0]


def _known_query(query: Mapping[str, str], known: tuple[str, ...]) -> None:
    unknown = sorted(set(query) - set(known))
    if unknown:
        raise _BadRequest(
            f"unknown query parameter(s) {', '.join(unknown)}; known: {', '.join(known)}",
            unknown[0],
        )


def _run(value: object) -> str:
    if not isinstance(value, str) or not RUN_PATTERN.fullmatch(value):
        raise _BadRequest(
            f"run {value!r} must be 1-64 letters, digits, '_', '.' or '-', not starting with "
            "'.', '_' or '-'",
            "run",
        )
    return value


def _int(value: object, name: str, minimum: int = 0) -> int:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value < 2**63:
        raise _BadRequest(f"{name} {value!r} must be an integer from {minimum} to 2**63 - 1", name)
    return value


def _float(value: object, name: str) -> float:
    try:
        number = float(value) if isinstance(value, str | int | float) else -1.0
    except ValueError:
        number = -1.0
    if not number >= 0 or isinstance(value, bool):
        raise _BadRequest(f"{name} {value!r} must be a number >= 0", name)
    return number
