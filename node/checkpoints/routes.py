"""The checkpoint routes: they read the request with its model, call CheckpointService (and the
coordinator's CheckpointOffice), and answer JSON; their docs are node.checkpoints.docs.

Who may call each (until the route declarations carry it):
- GET /v1/checkpoints: reader (any authenticated caller); forwarded to the coordinator.
- POST /v1/checkpoints/written, /prepare, /restored: operator (the node's own training
  processes, which sign as `cli-trainer` or present an operator certificate).
- POST /v1/checkpoints/news: peer (another node, sending its own news; forwarded to the
  coordinator by any node).

Every refusal answers `{"error": CODE, "reason": TEXT, "status": N}` (503 with Retry-After: 1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from node.checkpoints.docs import (
    CHECKPOINTS_PATH,
    NEWS_PATH,
    PREPARE_PATH,
    RESTORED_PATH,
    WRITTEN_PATH,
    LogAnswer,
    NewsBody,
    RestoredBody,
    RestoreStepBody,
    WrittenBody,
)
from node.checkpoints.service import CheckpointService
from node.checkpoints.view import checkpoints_view
from node.errors import AnsweredError, BodyError, CheckpointsError
from node.locks.routes import forward_to_coordinator
from node.openapi import parse_body
from node.security import is_client_id, request_sender

Handler = Callable[[web.Request], Awaitable[web.Response]]
B = TypeVar("B", bound=BaseModel)


def answers_refusals(handler: Handler) -> Handler:
    """An AnsweredError (CheckpointsError, LockError) as its JSON answer."""

    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except AnsweredError as exc:
            headers = {"Retry-After": "1"} if exc.status == 503 else None
            return web.json_response(exc.to_dict(), status=exc.status, headers=headers)

    return wrapped


async def body_of(model: type[B], request: web.Request) -> B:
    try:
        return parse_body(model, await request.read())
    except BodyError as exc:
        raise CheckpointsError(400, "invalid_body", exc.reason) from None


def checkpoint_routes(service: CheckpointService) -> list[web.RouteDef]:
    """The routes of the module docstring, served by `service`."""
    settings = service.runtime.settings

    async def listing(request: web.Request) -> web.Response:
        forwarded = await forward_to_coordinator(service.locks, request, None)
        if forwarded is not None:
            return forwarded
        book = await service.office.current()
        membership = service.runtime.membership
        nodes = [m.node_id for m in membership.members()] if membership is not None else []
        view = checkpoints_view(
            book,
            service.node_id,
            settings.checkpoint_replicas,
            service.office.keep,
            [service.node_id, *nodes],
        )
        return web.json_response(view.to_json())

    async def written(request: web.Request) -> web.Response:
        accepted = await service.written(await body_of(WrittenBody, request))
        return web.json_response(accepted.to_json(), status=202)

    async def prepare(request: web.Request) -> web.Response:
        body = await body_of(RestoreStepBody, request)
        plan = await service.prepare(body.step, body.generation)
        return web.json_response(plan.to_json())

    async def restored(request: web.Request) -> web.Response:
        recorded = service.restored(await body_of(RestoredBody, request))
        return web.json_response(recorded.to_json())

    async def news(request: web.Request) -> web.Response:
        body = await body_of(NewsBody, request)
        sender = request_sender()
        if sender is not None and not is_client_id(sender) and sender != body.node:
            raise CheckpointsError(
                403, "not_the_sender", f"{sender} may only send its own news, not {body.node}'s"
            )
        forwarded = await forward_to_coordinator(service.locks, request, body.model_dump())
        if forwarded is not None:
            return forwarded
        book = await service.office.receive(body)
        return web.json_response(LogAnswer(coordinator=service.node_id, log=book).to_json())

    return [
        web.get(CHECKPOINTS_PATH, answers_refusals(listing)),
        web.post(WRITTEN_PATH, answers_refusals(written)),
        web.post(PREPARE_PATH, answers_refusals(prepare)),
        web.post(RESTORED_PATH, answers_refusals(restored)),
        web.post(NEWS_PATH, answers_refusals(news)),
    ]
