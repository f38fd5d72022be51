"""The run routes over HTTP, each declared on its handler: POST/GET /v1/runs, GET
/v1/runs/{run_id}, POST /v1/runs/{run_id}/cancel (any node forwards them to the coordinator)
and POST /v1/results/fetch (the results node only). A RunError or LockError is answered by the
node's error middleware."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import SkipJsonSchema

from config.declare import READ, Caller, Refusal, route, unset
from node.component import Endpoint, endpoints
from node.errors import BodyError, RunError
from node.locks.routes import forward_to_coordinator
from node.openapi import parse_body
from node.runs.fetch import FetchBody, parse_fetch
from node.runs.queue import CancelBody, RunBody, RunList, RunRecord, parse_run_spec
from node.runs.results import FETCH_PATH
from node.runs.service import RunService

RUNS_PATH = "/v1/runs"
NO_QUORUM = Refusal(503, "no_lock_quorum", "no coordinator or no quorum")
NO_RUN = Refusal(404, "run_not_found", "no such run")
RUN_ID = ("run_id", "path", "the run's id", {"type": "string"})


class ListQuery(BaseModel):
    group: str | SkipJsonSchema[None] = unset("only the runs of this group")


def run_endpoints(service: RunService) -> list[Endpoint]:
    """The declared run routes over `service`."""
    return endpoints(RunRoutes(service))


class RunRoutes:
    """The handlers of the run routes, each calling one method of `service`."""

    def __init__(self, service: RunService) -> None:
        self.service = service

    @route(
        "POST",
        RUNS_PATH,
        callers=[Caller.OPERATOR],
        forwarded=True,
        answers=((201, "queued"),),
        errors=[
            Refusal(400, "invalid_run", "bad run"),
            Refusal(429, "run_queue_full", "the group's queue is full"),
            NO_QUORUM,
        ],
        body=RunBody,
        answer=RunRecord,
    )
    async def submit(self, request: web.Request) -> web.Response:
        """Queue a run {"argv", "group", "nodes", "role", "stack", "keep_alive",
        "max_duration_s", "results", "name"}; answers its record"""
        service = self.service
        body = await _json_body(request)
        spec = parse_run_spec(body, service.stacks)
        forwarded = await forward_to_coordinator(service.locks, request, body)
        if forwarded is not None:
            return forwarded
        return web.json_response((await service.submit_run(spec)).to_json(), status=201)

    @route(
        "GET",
        RUNS_PATH,
        callers=READ,
        answers=((200, "runs"),),
        errors=[NO_QUORUM],
        query=ListQuery,
        answer=RunList,
    )
    async def list_runs(self, request: web.Request) -> web.Response:
        """Every run (?group=G), oldest first"""
        forwarded = await forward_to_coordinator(self.service.locks, request, None)
        if forwarded is not None:
            return forwarded
        runs = await self.service.list_runs(request.query.get("group"))
        return web.json_response(runs.to_json())

    @route(
        "GET",
        f"{RUNS_PATH}/{{run_id}}",
        callers=READ,
        answers=((200, "the run"),),
        errors=[NO_RUN, NO_QUORUM],
        params=(RUN_ID,),
        answer=RunRecord,
    )
    async def get(self, request: web.Request) -> web.Response:
        """One run's record: state, step, log, results"""
        forwarded = await forward_to_coordinator(self.service.locks, request, None)
        if forwarded is not None:
            return forwarded
        record = await self.service.get_run(request.match_info["run_id"])
        return web.json_response(record.to_json())

    @route(
        "POST",
        f"{RUNS_PATH}/{{run_id}}/cancel",
        callers=[Caller.OPERATOR],
        forwarded=True,
        answers=((200, "cancelled"),),
        errors=[
            Refusal(400, "invalid_run", "a body other than {}"),
            NO_RUN,
            Refusal(409, "run_ended", "already ended"),
            NO_QUORUM,
        ],
        params=(RUN_ID,),
        body=CancelBody,
        body_optional=True,
        answer=RunRecord,
    )
    async def cancel(self, request: web.Request) -> web.Response:
        """Cancel: a queued run is removed, a running one killed (results still collected)"""
        try:
            parse_body(CancelBody, await request.read(), optional=True)
        except BodyError as exc:
            raise RunError(400, "invalid_run", exc.reason) from None
        forwarded = await forward_to_coordinator(self.service.locks, request, {})
        if forwarded is not None:
            return forwarded
        record = await self.service.cancel_run(request.match_info["run_id"])
        return web.json_response(record.to_json())

    @route(
        "POST",
        FETCH_PATH,
        callers=[Caller.FENCED, Caller.OPERATOR],
        answers=((200, "stored, or missing on the member"),),
        errors=[
            Refusal(400, "invalid_fetch", "bad request"),
            Refusal(409, "not_results_node", "this node is not results.node"),
            Refusal(502, "result_download_failed", "the member could not be read"),
            Refusal(503, "node_unknown", "the member is not in this node's view"),
        ],
        body=FetchBody,
    )
    async def fetch(self, request: web.Request) -> web.Response:
        """The results node only: fetch {"key", "node", "job_id", "path"} from that member
        node's job and store it at key (answers once stored, hash checked)"""
        body = await _json_body(request)
        self.service.own_results()  # another node answers 409 whatever its body
        return web.json_response(await self.service.fetch_result(parse_fetch(body)))


async def _json_body(request: web.Request) -> Any:
    """The request's JSON body; RunError 400 when it is not JSON."""
    try:
        return await request.json()
    except ValueError as exc:
        raise RunError(400, "invalid_run", f"the body is not JSON: {exc}") from exc
