"""The weights control plane of one daemon: update offers from the trainer's publisher, the
long poll its receiver process waits on, applied reports, status, metrics and the WAL record.

Routes: POST /v1/weights/update (fenced by the plan), GET /v1/weights/next, POST
/v1/weights/applied, GET /v1/weights/status, and the weights group for GET /v1/rendezvous.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field, model_validator

from node.component import Endpoint, paired
from node.errors import BodyError, NodeError
from node.openapi import BODY_CONFIG, Count, RouteDoc, parse_body
from node.plan import FENCE_HEADER, PlanError, PlanFence, RolePlan, check_fence
from node.rl.digest import ALGOS, SHA256_ALGO, Digest
from node.rl.group import weights_rendezvous_for
from node.rl.offers import OfferTaken, WeightsOffer, WeightsRuns, WeightsStatus
from node.security import json_error
from wal import WriteAheadLog

log = logging.getLogger(__name__)

RUN_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_POLL_S = 60.0
DEFAULT_POLL_S = 10.0
SOURCES = ("broadcast", "file")
WAL_ENTRY = "rl.weights_applied"
UPDATE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


_RUN = Field(
    pattern=RUN_PATTERN.pattern,
    description="the run's name: 1-64 letters, digits, '_', '.' or '-', not starting with "
    "'.', '_' or '-'",
)
_SHA = Field(
    default=None,
    pattern=r"^[0-9a-f]{64}$",
    description="the previous release's digest field (64 lowercase hex digits), read as "
    "digest {algo: sha256} when digest is absent; sent beside digest only when its algo is "
    "sha256",
)
_SECONDS = Field(ge=0)


class ParamBody(BaseModel):
    """One parameter of an offer, as the publisher describes it (ParamInfo.to_dict)."""

    model_config = BODY_CONFIG

    name: str
    shape: list[Count]
    dtype: str
    nbytes: Count


class DigestBody(BaseModel):
    """A weights digest: the algorithm and its value (docs/gpus.md defines them)."""

    model_config = BODY_CONFIG

    algo: str = Field(
        pattern=r"^[a-z0-9][a-z0-9.-]{0,31}$",
        description=f"the digest algorithm; this release knows {', '.join(ALGOS)}",
    )
    value: str = Field(pattern=r"^[0-9a-f]{16,128}$", description="lowercase hex digits")


def _digest_schema(schema: dict[str, Any]) -> None:
    """The schema of a DigestedBody: `digest` or `sha256` required, neither null."""
    for name in ("digest", "sha256"):
        found = schema["properties"][name]
        (kept,) = [b for b in found.pop("anyOf") if b.get("type") != "null"]
        found.pop("default", None)
        found.update(kept)
    schema["anyOf"] = [{"required": ["digest"]}, {"required": ["sha256"]}]


class DigestedBody(BaseModel):
    """A body that names weights by their digest: `digest`, or the previous release's
    `sha256` alone (read as digest {algo: sha256}); `sha256` beside `digest` is not read."""

    model_config = BODY_CONFIG | ConfigDict(json_schema_extra=_digest_schema)

    digest: DigestBody | None = Field(default=None, description="the weights' digest")
    sha256: str | None = _SHA

    @model_validator(mode="after")
    def _one_digest(self) -> Self:
        for name in ("digest", "sha256"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} must not be null: leave it out instead")
        if self.digest is None and self.sha256 is None:
            raise ValueError("give digest {algo, value} (or the previous release's sha256)")
        return self

    def weights_digest(self) -> Digest:
        if self.digest is not None:
            return Digest(self.digest.algo, self.digest.value)
        return Digest(SHA256_ALGO, str(self.sha256))

    def normalized(self) -> dict[str, Any]:
        """The body as a dict with `digest` always, `sha256` (equal to its value) only beside
        digest algo sha256."""
        dumped = self.model_dump(exclude={"digest", "sha256"})
        return dumped | self.weights_digest().fields()


class OfferBody(DigestedBody):
    """Body of `POST /v1/weights/update`: a new version's weights on offer."""

    run: str = _RUN
    version: Count = Field(description="the version; strictly increasing per run")
    params: list[ParamBody] = Field(description="every parameter, in broadcast order")
    total_bytes: Count
    deadline_s: float = Field(ge=0, description="seconds the publisher waits for receivers")
    sent_at: float = Field(default=0, ge=0, description="unix seconds the trainer sent it")
    group: dict[str, Any] | None = Field(
        default=None, description="the broadcast group: master_addr, master_port, prefix"
    )


class AppliedBody(DigestedBody):
    """Body of `POST /v1/weights/applied`: the weights a local process applied or published."""

    run: str = _RUN
    version: Count
    bytes: Count
    source: Literal["broadcast", "file"] = Field(description="'broadcast' or 'file'")
    receivers: list[str] = Field(default_factory=list, description="node ids that acknowledged")
    sent_at: float | None = Field(default=None, ge=0, description="unix seconds it was sent")


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
        run = (
            "run",
            "query",
            "the run's name",
            {"type": "string", "pattern": RUN_PATTERN.pattern, "x-required": True},
        )
        return [
            RouteDoc(
                "POST",
                "/v1/weights/update",
                "Offer weights of a new version to this node's receiver (trainer's daemon or "
                "publisher -> receiver node); carries the plan fence",
                ((200, "offered"), (400, "malformed"), (409, "version not newer, or stale fence")),
                body=OfferBody,
                response=OfferTaken,
            ),
            RouteDoc(
                "GET",
                "/v1/weights/next",
                "Long poll for the next weights offer after version `after`",
                ((200, "the offer"), (204, "no offer within timeout_s"), (400, "malformed")),
                parameters=(
                    run,
                    (
                        "after",
                        "query",
                        "last version held (default -1)",
                        {"type": "integer", "minimum": -1, "maximum": 2**63 - 1},
                    ),
                    (
                        "timeout_s",
                        "query",
                        f"seconds to wait, 0 to {MAX_POLL_S:g} (default {DEFAULT_POLL_S:g})",
                        {"type": "number", "minimum": 0, "maximum": MAX_POLL_S},
                    ),
                ),
                response=WeightsOffer,
            ),
            RouteDoc(
                "POST",
                "/v1/weights/applied",
                "A local process reports the weights it applied (receiver) or published",
                ((200, "status"), (400, "malformed"), (409, "older than the applied version")),
                body=AppliedBody,
                response=WeightsStatus,
            ),
            RouteDoc(
                "GET",
                "/v1/weights/status",
                "The weights applied for a run: version, digest, applied_at, source, bytes",
                ((200, "status"), (400, "malformed"), (404, "no weights for this run")),
                parameters=(run,),
                response=WeightsStatus,
            ),
            RouteDoc(
                "GET",
                "/v1/weights/runs",
                "Every run this node knows weights of (offered or applied), each with its "
                "applied weights' status or null; the dashboard asks each member once for all",
                ((200, "the runs"),),
                response=WeightsRuns,
            ),
        ]

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
