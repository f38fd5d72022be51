"""The checkpoint routes, declared on their handlers: they read the request with its model, call
CheckpointService (and the coordinator's CheckpointOffice), and answer JSON. The training
processes of a node (which sign as `cli-trainer` or present an operator certificate) report
what they wrote, prepare and record restores; nodes send their news to the coordinator; anyone
authenticated reads GET /v1/checkpoints. A CheckpointsError or LockError is answered by the
node's error middleware (503 with Retry-After: 1)."""

from __future__ import annotations

from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from config.declare import READ, Caller, Refusal, route
from node.checkpoints.service import CheckpointService
from node.checkpoints.view import checkpoints_view
from node.checkpoints.wire import (
    CHECKPOINTS_PATH,
    NEWS_PATH,
    PREPARE_PATH,
    RESTORED_PATH,
    WRITTEN_PATH,
    Accepted,
    CheckpointsView,
    LogAnswer,
    NewsBody,
    RestoredBody,
    RestorePlan,
    RestoreRecorded,
    RestoreStepBody,
    WrittenBody,
)
from node.errors import BodyError, CheckpointsError
from node.locks.routes import NO_QUORUM, forward_to_coordinator
from node.openapi import parse_body
from node.security import is_client_id, request_sender

B = TypeVar("B", bound=BaseModel)
BAD_BODY = Refusal(400, "invalid_body", "bad request")
TRAINERS = (Caller.OPERATOR,)
"""The node's own training processes: they sign as `cli-trainer` (or use an operator
certificate)."""


async def body_of(model: type[B], request: web.Request) -> B:
    try:
        return parse_body(model, await request.read())
    except BodyError as exc:
        raise CheckpointsError(400, "invalid_body", exc.reason) from None


class CheckpointRoutes:
    """The routes of the module docstring, served by `service`."""

    def __init__(self, service: CheckpointService) -> None:
        self.service = service

    @route(
        "GET",
        CHECKPOINTS_PATH,
        callers=READ,
        answers=((200, "the checkpoints"),),
        errors=[NO_QUORUM],
        answer=CheckpointsView,
    )
    async def listing(self, request: web.Request) -> web.Response:
        """The committed training checkpoints (from the coordinator): the newest step to
        restore, the nodes holding each node's files, every node's last restore"""
        service = self.service
        forwarded = await forward_to_coordinator(service.locks, request, None)
        if forwarded is not None:
            return forwarded
        book = await service.office.current()
        membership = service.runtime.membership
        nodes = [m.node_id for m in membership.members()] if membership is not None else []
        view = checkpoints_view(
            book,
            service.node_id,
            service.runtime.settings.checkpoint_replicas,
            service.office.keep,
            [service.node_id, *nodes],
        )
        return web.json_response(view.to_json())

    @route(
        "POST",
        WRITTEN_PATH,
        callers=TRAINERS,
        answers=((202, "taken"),),
        errors=[
            BAD_BODY,
            Refusal(409, "wrong_directory", "the report does not fit its step"),
            Refusal(409, "file_changed", "a file differs from the report"),
        ],
        body=WrittenBody,
        answer=Accepted,
    )
    async def written(self, request: web.Request) -> web.Response:
        """A training process of this node wrote its files of a step (sizes and hashes); the
        coordinator commits the step once every rank of the generation reported it"""
        accepted = await self.service.written(await body_of(WrittenBody, request))
        return web.json_response(accepted.to_json(), status=202)

    @route(
        "POST",
        PREPARE_PATH,
        callers=TRAINERS,
        answers=((200, "every file is here"),),
        errors=[
            BAD_BODY,
            Refusal(404, "not_committed", "the step is not committed"),
            Refusal(503, "fetch_failed", "the files could not be fetched; retry"),
        ],
        body=RestoreStepBody,
        answer=RestorePlan,
    )
    async def prepare(self, request: web.Request) -> web.Response:
        """Have every file of a committed step on this node, fetched from the peers that hold
        what this node lacks (verified), before the ranks load it"""
        body = await body_of(RestoreStepBody, request)
        plan = await self.service.prepare(body.step, body.generation)
        return web.json_response(plan.to_json())

    @route(
        "POST",
        RESTORED_PATH,
        callers=TRAINERS,
        answers=((200, "recorded"),),
        errors=[BAD_BODY, Refusal(404, "not_prepared", "no such prepared step")],
        body=RestoredBody,
        answer=RestoreRecorded,
    )
    async def restored(self, request: web.Request) -> web.Response:
        """A training process of this node loaded a committed step: the node's last restore"""
        recorded = self.service.restored(await body_of(RestoredBody, request))
        return web.json_response(recorded.to_json())

    @route(
        "POST",
        NEWS_PATH,
        callers=[Caller.PEER],
        answers=((200, "the log"),),
        errors=[
            BAD_BODY,
            Refusal(403, "not_the_sender", "a node may only send its own news"),
            NO_QUORUM,
        ],
        body=NewsBody,
        answer=LogAnswer,
    )
    async def news(self, request: web.Request) -> web.Response:
        """Nodes only, to the coordinator (forwarded by any node): written reports, copies held,
        the last restore; answers the checkpoint log"""
        service = self.service
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
