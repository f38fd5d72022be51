"""The run routes over HTTP: POST/GET /v1/runs, GET /v1/runs/{run_id}, POST
/v1/runs/{run_id}/cancel (any node forwards them to the coordinator) and POST /v1/results/fetch
(the results node only), each paired with its doc of docs.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from node.component import Endpoint, paired
from node.errors import BodyError, RunError
from node.locks.routes import answers_lock_errors, forward_to_coordinator
from node.openapi import parse_body
from node.runs.docs import RUNS_PATH, run_route_docs
from node.runs.fetch import parse_fetch
from node.runs.queue import CancelBody, parse_run_spec
from node.runs.results import FETCH_PATH
from node.runs.service import RunService

Handler = Callable[[web.Request], Awaitable[web.Response]]


def answers_run_errors(handler: Handler) -> Handler:
    """Answer a RunError (and a LockError) raised by `handler` in the one JSON error shape."""

    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await answers_lock_errors(handler)(request)
        except RunError as exc:
            return web.json_response(exc.to_dict(), status=exc.status)

    return wrapped


def run_endpoints(service: RunService) -> list[Endpoint]:
    """The run routes over `service`, each with its doc."""
    return paired(run_routes(service), run_route_docs())


def run_routes(service: RunService) -> list[web.RouteDef]:
    """The handlers of the run routes, each calling one method of `service`."""

    async def submit(request: web.Request) -> web.Response:
        body = await _json_body(request)
        spec = parse_run_spec(body, service.stacks)
        forwarded = await forward_to_coordinator(service.locks, request, body)
        if forwarded is not None:
            return forwarded
        return web.json_response((await service.submit_run(spec)).to_json(), status=201)

    async def list_runs(request: web.Request) -> web.Response:
        forwarded = await forward_to_coordinator(service.locks, request, None)
        if forwarded is not None:
            return forwarded
        runs = await service.list_runs(request.query.get("group"))
        return web.json_response(runs.to_json())

    async def get(request: web.Request) -> web.Response:
        forwarded = await forward_to_coordinator(service.locks, request, None)
        if forwarded is not None:
            return forwarded
        return web.json_response((await service.get_run(request.match_info["run_id"])).to_json())

    async def cancel(request: web.Request) -> web.Response:
        try:
            parse_body(CancelBody, await request.read(), optional=True)
        except BodyError as exc:
            raise RunError(400, "invalid_run", exc.reason) from None
        forwarded = await forward_to_coordinator(service.locks, request, {})
        if forwarded is not None:
            return forwarded
        record = await service.cancel_run(request.match_info["run_id"])
        return web.json_response(record.to_json())

    async def fetch(request: web.Request) -> web.Response:
        body = await _json_body(request)
        service.own_results()  # another node answers 409 whatever its body
        return web.json_response(await service.fetch_result(parse_fetch(body)))

    return [
        web.post(RUNS_PATH, answers_run_errors(submit)),
        web.get(RUNS_PATH, answers_run_errors(list_runs)),
        web.get(f"{RUNS_PATH}/{{run_id}}", answers_run_errors(get)),
        web.post(f"{RUNS_PATH}/{{run_id}}/cancel", answers_run_errors(cancel)),
        web.post(FETCH_PATH, answers_run_errors(fetch)),
    ]


async def _json_body(request: web.Request) -> Any:
    """The request's JSON body; RunError 400 when it is not JSON."""
    try:
        return await request.json()
    except ValueError as exc:
        raise RunError(400, "invalid_run", f"the body is not JSON: {exc}") from exc
