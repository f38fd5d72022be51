"""The rl package over HTTP: the weights plane's routes (POST /v1/weights/update, GET
/v1/weights/next, POST /v1/weights/applied, GET /v1/weights/status, GET /v1/weights/runs and the
weights group of GET /v1/rendezvous) and the rollouts backlog's (POST /v1/rollouts/consumed,
GET /v1/rollouts/pending), each declared on its handler. Requests are parsed here; the
services hold the state.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping

from aiohttp import web

from config.declare import READ, Caller, Refusal, route
from node.component import Endpoint, endpoints
from node.errors import AnsweredError, BodyError, NodeError
from node.openapi import parse_body
from node.plan import FENCE_HEADER, PlanError, PlanFence, check_fence
from node.rl.backlog import RolloutBacklog, RunBacklog
from node.rl.offers import OfferTaken, WeightsOffer, WeightsRuns, WeightsStatus
from node.rl.service import WeightsService
from node.rl.wire import (
    CONSUMED_PATH,
    DEFAULT_POLL_S,
    MAX_POLL_S,
    PENDING_PATH,
    RUN_PATTERN,
    TS_BOUND,
    AppliedBody,
    BacklogAnswer,
    ConsumedBody,
    NextQuery,
    OfferBody,
    RunQuery,
)
from node.security import json_error

MALFORMED = Refusal(400, "bad_request", "malformed")


class _BadRequest(NodeError):
    def __init__(self, reason: str, param: str) -> None:
        super().__init__(reason)
        self.reason, self.param = reason, param


class WeightsRoutes:
    """The weights routes of `service`; `rendezvous` is the handler of GET
    /v1/rendezvous?group=weights&run=R (ElectionService.group_handlers["weights"])."""

    def __init__(self, service: WeightsService) -> None:
        self._service = service

    def routes(self) -> list[Endpoint]:
        return endpoints(self)

    async def rendezvous(self, request: web.Request) -> web.Response:
        """GET /v1/rendezvous?group=weights&run=R: this node's view of the run's weights group."""
        try:
            run = _run(request.query.get("run", ""))
        except _BadRequest as exc:
            return json_error(400, exc.reason, param=exc.param)
        found = self._service.rendezvous_of(run)
        if found is None:
            return json_error(409, "no role plan yet: no coordinator has published one")
        return web.json_response(found.to_dict())

    @route(
        "POST",
        "/v1/weights/update",
        callers=[Caller.FENCED, Caller.OPERATOR],
        answers=((200, "offered"),),
        errors=[
            Refusal(400, "bad_request", "malformed"),
            Refusal(409, "stale_fence", "version not newer, or stale fence"),
        ],
        body=OfferBody,
        answer=OfferTaken,
    )
    async def _update(self, request: web.Request) -> web.Response:
        """Offer weights of a new version to this node's receiver (trainer's daemon or
        publisher -> receiver node); carries the plan fence"""
        plan = self._service.plan()
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
        try:
            taken = self._service.offer(WeightsOffer.model_validate(body.normalized()))
        except AnsweredError as exc:
            return json_error(exc.status, exc.reason, code=exc.code)
        return web.json_response(taken.to_json())

    @route(
        "GET",
        "/v1/weights/next",
        callers=READ,
        answers=((200, "the offer"), (204, "no offer within timeout_s")),
        errors=[MALFORMED],
        query=NextQuery,
        answer=WeightsOffer,
    )
    async def _next(self, request: web.Request) -> web.Response:
        """Long poll for the next weights offer after version `after`"""
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
        offer = await self._service.next_offer(run, after, timeout_s)
        if offer is None:
            return web.Response(status=204)
        return web.json_response(offer.to_json())

    @route(
        "POST",
        "/v1/weights/applied",
        callers=[Caller.PEER, Caller.OPERATOR],
        answers=((200, "status"),),
        errors=[MALFORMED, Refusal(409, "conflict", "older than the applied version")],
        body=AppliedBody,
        answer=WeightsStatus,
    )
    async def _applied(self, request: web.Request) -> web.Response:
        """A local process reports the weights it applied (receiver) or published"""
        try:
            report = parse_body(AppliedBody, await request.read()).normalized()
        except BodyError as exc:
            return json_error(400, exc.reason, param=_param(exc))
        try:
            status = await self._service.applied(report)
        except AnsweredError as exc:
            return json_error(exc.status, exc.reason, code=exc.code)
        return web.json_response(status.to_json())

    @route(
        "GET", "/v1/weights/runs", callers=READ, answers=((200, "the runs"),), answer=WeightsRuns
    )
    async def _runs_status(self, request: web.Request) -> web.Response:
        """Every run this node knows weights of (offered or applied), each with its applied
        weights' status or null; the dashboard asks each member once for all"""
        return web.json_response(self._service.applied_runs().to_json())

    @route(
        "GET",
        "/v1/weights/status",
        callers=READ,
        answers=((200, "status"),),
        errors=[MALFORMED, Refusal(404, "no_weights", "no weights for this run")],
        query=RunQuery,
        answer=WeightsStatus,
    )
    async def _status(self, request: web.Request) -> web.Response:
        """The weights applied for a run: version, digest, applied_at, source, bytes"""
        try:
            _known_query(request.query, ("run",))
            run = _run(request.query.get("run", ""))
        except _BadRequest as exc:
            return json_error(400, exc.reason, param=exc.param)
        status = self._service.status_of(run)
        if status is None:
            return json_error(
                404, f"run {run!r} has no weights on this node yet", code="no_weights"
            )
        return web.json_response(status.to_json())


class BacklogRoutes:
    """The consumed/pending routes of the rollouts backlog `backlog`."""

    def __init__(self, backlog: RolloutBacklog) -> None:
        self._backlog = backlog

    def routes(self) -> list[Endpoint]:
        return endpoints(self)

    def _answer(self, run: str, state: RunBacklog) -> web.Response:
        consumed = state.consumed
        return web.json_response(
            {
                "run": run,
                "pending": state.pending + state.inflight,
                "max_pending": self._backlog.max_pending,
                "consumed": None if consumed is None else {"ts": consumed[0], "after": consumed[1]},
            }
        )

    @route(
        "POST",
        CONSUMED_PATH,
        callers=[Caller.PEER, Caller.OPERATOR],
        answers=((200, "the run's backlog"),),
        errors=[MALFORMED],
        body=ConsumedBody,
        answer=BacklogAnswer,
    )
    async def _consumed(self, request: web.Request) -> web.Response:
        """The trainer's RolloutStream consumed this node's rollouts of `run` through (ts,
        after) in (created_at, sample_id) order: producers may add that many more"""
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            return json_error(400, f"body is not JSON: {exc}", param="body")
        problem = _consumed_problem(body)
        if problem is not None:
            return json_error(400, problem[1], param=problem[0])
        state = await self._backlog.consumed(body["run"], (float(body["ts"]), body["after"]))
        return self._answer(body["run"], state)

    @route(
        "GET",
        PENDING_PATH,
        callers=READ,
        answers=((200, "the run's backlog"),),
        errors=[MALFORMED, Refusal(503, "unavailable", "store not open")],
        query=RunQuery,
        answer=BacklogAnswer,
    )
    async def _pending(self, request: web.Request) -> web.Response:
        """Unconsumed rollouts of `run` in this node's store (counted now) and the cap"""
        extra = set(request.query) - {"run"}
        if extra:
            return json_error(400, "unknown parameter", param=sorted(extra)[0])
        run = request.query.get("run", "")
        if not RUN_PATTERN.match(run):
            return json_error(400, f"run {run!r} is not a run name", param="run")
        state = await self._backlog.recount(run)
        if state is None:
            return json_error(503, "the rollouts store is not open yet", retry_after_s=1.0)
        return self._answer(run, state)


def _consumed_problem(body: object) -> tuple[str, str] | None:
    """(field, reason) of what is wrong with a consumed report, or None."""
    if not isinstance(body, dict):
        return "body", "body must be a JSON object {run, ts, after}"
    extra = set(body) - {"run", "ts", "after"}
    if extra:
        return sorted(extra)[0], "unknown field"
    run, ts, after = body.get("run"), body.get("ts"), body.get("after")
    if not isinstance(run, str) or not RUN_PATTERN.match(run):
        return "run", f"run {run!r} is not a run name"
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        return "ts", "ts must be a finite number (created_at of the last sample consumed)"
    if abs(ts) > TS_BOUND:
        return "ts", f"ts must be within +-{TS_BOUND:g} (created_at of the last sample consumed)"
    if not isinstance(after, str):
        return "after", "after must be a string (sample_id of the last sample consumed)"
    return None


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
