"""The training routes: a training process posts its reports (POST /v1/training/reports), a node
serves its part of the group (GET /v1/training/node), any node answers for the whole group
(GET /v1/training), and the coordinator takes a node's request to restart the group
(POST /v1/training/restart). Who may call each is said beside it."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from node.component import Endpoint, paired
from node.errors import BodyError
from node.openapi import RouteDoc, parse_body
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
HISTORY = (
    "history",
    "query",
    "1: add each rank's last 15 minutes of steps/s, compute and scalars",
    {"enum": ["0", "1"]},
)


def _history(request: web.Request) -> bool | web.Response:
    value = request.query.get("history", "0")
    if value not in ("0", "1"):
        return json_error(400, f"history must be 0 or 1, not {value[:20]!r}", param="history")
    return value == "1"


def training_route_docs() -> list[RouteDoc]:
    return [
        RouteDoc(
            "POST",
            REPORTS_PATH,
            "A training process's batch of progress reports (shoal.training_session): its "
            "steps, compute seconds and scalars; answers the node's generation",
            ((200, "kept (accepted 0: an older generation)"), (400, "bad body"), (413, "too big")),
            body=ReportsBody,
            response=ReportsAnswer,
        ),
        RouteDoc(
            "GET",
            NODE_PATH,
            "This node's part of the training group: its ranks' progress, whether its workers "
            "run, and what other packages add",
            ((200, "this node's part"), (400, "bad query")),
            parameters=(HISTORY,),
            response=NodeProgress,
        ),
        RouteDoc(
            "GET",
            TRAINING_PATH,
            "The whole training group from any node: generation, every rank's step, steps/s, "
            "compute and straggler flag, the hang verdict, restarts with their reasons, the "
            "nodes that did not answer in time",
            ((200, "the group"), (400, "bad query")),
            parameters=(HISTORY,),
            response=TrainingView,
        ),
        RouteDoc(
            "POST",
            RESTART_PATH,
            "Ask the coordinator to restart the training group of a generation (a worker "
            "exited on the asking node)",
            ((200, "accepted, or stale"), (400, "bad body"), (503, "not the coordinator")),
            body=RestartBody,
            response=RestartAnswer,
        ),
    ]


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


def training_routes(training: TrainingApi) -> list[Endpoint]:
    """The routes over `training`, paired with their docs."""

    # operator: the training process signs as a `cli-` client (shoal._daemon)
    async def post_reports(request: web.Request) -> web.Response:
        if (request.content_length or 0) > MAX_REPORTS_BYTES:
            return json_error(413, f"a batch of reports is at most {MAX_REPORTS_BYTES} bytes")
        try:
            body = parse_body(ReportsBody, await request.read())
        except BodyError as exc:
            return json_error(400, exc.reason, field=exc.field)
        return web.json_response(training.accept(body).to_json())

    # reader: any authenticated caller (the other nodes gather it)
    async def get_node(request: web.Request) -> web.Response:
        history = _history(request)
        if isinstance(history, web.Response):
            return history
        return web.json_response(training.node_progress(history).to_json())

    # reader: any authenticated caller
    async def get_training(request: web.Request) -> web.Response:
        history = _history(request)
        if isinstance(history, web.Response):
            return history
        if training.is_coordinator():
            view = await training.view(history)
        else:
            view = await training.coordinator_view(history)
        return web.json_response(view.to_json())

    # peer: another node of the cluster asks the coordinator
    async def post_restart(request: web.Request) -> web.Response:
        try:
            body = parse_body(RestartBody, await request.read())
        except BodyError as exc:
            return json_error(400, exc.reason, field=exc.field)
        if not training.is_coordinator():
            who = training.runtime.coordinator or "nobody yet"
            return json_error(503, f"{training.runtime.node_id} does not coordinate ({who} does)")
        answer = await training.ask_restart(body)
        return web.json_response(answer.to_json())

    served = [
        web.post(REPORTS_PATH, post_reports),
        web.get(NODE_PATH, get_node),
        web.get(TRAINING_PATH, get_training),
        web.post(RESTART_PATH, post_restart),
    ]
    return paired(served, training_route_docs())
