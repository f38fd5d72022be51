"""The training routes, declared on their handlers: a training process posts its reports (POST
/v1/training/reports), a node serves its part of the group (GET /v1/training/node), any node
answers for the whole group (GET /v1/training), and the coordinator takes a node's request to
restart the group (POST /v1/training/restart)."""

from __future__ import annotations

from typing import Literal, Protocol

from aiohttp import web
from pydantic import BaseModel, Field

from config.declare import READ, Caller, Refusal, route
from node.errors import BodyError
from node.openapi import parse_body
from node.runtime import NodeRuntime
from node.security import json_error
from node.training.models import (
    NODE_PATH,
    REPORTS_PATH,
    RESTART_PATH,
    TRAINING_PATH,
    NodeProgress,
    ReportsAnswer,
    ReportsBody,
    RestartAnswer,
    RestartBody,
    TrainingView,
)

MAX_REPORTS_BYTES = 1024 * 1024
"""A batch of reports larger than this is refused (413) before it is parsed."""
BAD_QUERY = Refusal(400, "bad_request", "history is not 0 or 1")
BAD_BODY = Refusal(400, "bad_request", "a body its model refuses")


class HistoryQuery(BaseModel):
    """The query of GET /v1/training and /v1/training/node."""

    history: Literal["0", "1"] = Field(
        default="0",
        description="1: add each rank's last 15 minutes of steps/s, compute and scalars",
    )


def _history(request: web.Request) -> bool | web.Response:
    value = request.query.get("history", "0")
    if value not in ("0", "1"):
        return json_error(400, f"history must be 0 or 1, not {value[:20]!r}", param="history")
    return value == "1"


class TrainingApi(Protocol):
    """What the routes ask of node.training.component's TrainingComponent."""

    @property
    def runtime(self) -> NodeRuntime: ...
    def is_coordinator(self) -> bool: ...
    def accept(self, body: ReportsBody) -> ReportsAnswer: ...
    def node_progress(self, history: bool = False) -> NodeProgress: ...
    async def view(self, history: bool = False) -> TrainingView: ...
    async def coordinator_view(self, history: bool) -> TrainingView: ...
    async def ask_restart(self, body: RestartBody) -> RestartAnswer: ...


class TrainingRoutes:
    """The routes over `training` (node.training.component's TrainingComponent)."""

    def __init__(self, training: TrainingApi) -> None:
        self.training = training

    @route(
        "POST",
        REPORTS_PATH,
        callers=[Caller.OPERATOR],
        answers=((200, "kept (accepted 0: an older generation)"),),
        errors=[BAD_BODY, Refusal(413, "too_large", "a batch over 1 MiB")],
        body=ReportsBody,
        answer=ReportsAnswer,
    )
    async def post_reports(self, request: web.Request) -> web.Response:
        """A training process's batch of progress reports (shoal.training_session; it signs as
        a `cli-` client): its steps, compute seconds and scalars; answers the node's
        generation"""
        if (request.content_length or 0) > MAX_REPORTS_BYTES:
            return json_error(413, f"a batch of reports is at most {MAX_REPORTS_BYTES} bytes")
        try:
            body = parse_body(ReportsBody, await request.read())
        except BodyError as exc:
            return json_error(400, exc.reason, field=exc.field)
        return web.json_response(self.training.accept(body).to_json())

    @route(
        "GET",
        NODE_PATH,
        callers=READ,
        answers=((200, "this node's part"),),
        errors=[BAD_QUERY],
        query=HistoryQuery,
        answer=NodeProgress,
    )
    async def get_node(self, request: web.Request) -> web.Response:
        """This node's part of the training group: its ranks' progress, whether its workers
        run, and what other packages add (the other nodes gather it)"""
        history = _history(request)
        if isinstance(history, web.Response):
            return history
        return web.json_response(self.training.node_progress(history).to_json())

    @route(
        "GET",
        TRAINING_PATH,
        callers=READ,
        answers=((200, "the group"),),
        errors=[BAD_QUERY],
        query=HistoryQuery,
        answer=TrainingView,
    )
    async def get_training(self, request: web.Request) -> web.Response:
        """The whole training group from any node: generation, every rank's step, steps/s,
        compute and straggler flag, the hang verdict, restarts with their reasons, the
        committed checkpoint and each node's last restore, the nodes that did not answer in
        time"""
        history = _history(request)
        if isinstance(history, web.Response):
            return history
        training = self.training
        if training.is_coordinator():
            view = await training.view(history)
        else:
            view = await training.coordinator_view(history)
        return web.json_response(view.to_json())

    @route(
        "POST",
        RESTART_PATH,
        callers=[Caller.PEER, Caller.OPERATOR],
        answers=((200, "accepted, or stale"),),
        errors=[BAD_BODY, Refusal(503, "unavailable", "this node does not coordinate")],
        body=RestartBody,
        answer=RestartAnswer,
    )
    async def post_restart(self, request: web.Request) -> web.Response:
        """Ask the coordinator to restart the training group of a generation (a worker exited
        on the asking node, or an operator asks)"""
        try:
            body = parse_body(RestartBody, await request.read())
        except BodyError as exc:
            return json_error(400, exc.reason, field=exc.field)
        training = self.training
        if not training.is_coordinator():
            who = training.runtime.coordinator or "nobody yet"
            return json_error(503, f"{training.runtime.node_id} does not coordinate ({who} does)")
        answer = await training.ask_restart(body)
        return web.json_response(answer.to_json())
