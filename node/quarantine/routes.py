"""The GPU quarantine routes (POST /v1/gpu/quarantine|readmit): read the body, check that a node
speaks for its own GPUs, forward to the coordinator like drains, answer its QuarantineAnswer.
Their docs are node.quarantine.docs. Every error answers LockError's shape (503 with
`Retry-After: 1`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from pydantic import BaseModel

from node.errors import LockError
from node.locks.routes import answers_lock_errors, checked_body, forward_to_coordinator
from node.locks.service import FORWARDED_HEADER
from node.quarantine.docs import (
    QUARANTINE_PATH,
    READMIT_PATH,
    QuarantineAnswer,
    QuarantineBody,
    ReadmitBody,
)
from node.quarantine.service import QuarantineService
from node.security import is_client_id, request_sender


def check_own(request: web.Request, node: str) -> None:
    """LockError 403 unless the signed sender is the node it speaks for (or a node forwarding
    such a call); an unsigned request (a cluster without a secret) is not checked."""
    sender = request_sender()
    if sender is None:
        return
    if is_client_id(sender):
        raise LockError(403, "not_a_node", f"{sender} is a client: only a node reports its GPUs")
    if sender != node and not request.headers.get(FORWARDED_HEADER):
        raise LockError(
            403, "not_your_gpu", f"node {sender} may report only its own GPUs, not {node}'s"
        )


def quarantine_routes(service: QuarantineService) -> list[web.RouteDef]:
    """POST /v1/gpu/quarantine and POST /v1/gpu/readmit, at the coordinator or forwarded to
    it. Who may call them: peer (a node, about its own GPUs)."""

    def route(
        model: type[QuarantineBody] | type[ReadmitBody],
        serve: Callable[[BaseModel], Awaitable[QuarantineAnswer]],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            body = checked_body(model, await request.read())
            check_own(request, body.node)
            forwarded = await forward_to_coordinator(service.locks, request, body.model_dump())
            if forwarded is not None:
                return forwarded
            answer = await serve(body)
            return web.json_response(answer.to_json())

        return answers_lock_errors(handle)

    async def report(body: BaseModel) -> QuarantineAnswer:
        assert isinstance(body, QuarantineBody)
        return await service.report(body)

    async def readmit(body: BaseModel) -> QuarantineAnswer:
        assert isinstance(body, ReadmitBody)
        return await service.readmit(body)

    return [
        web.post(QUARANTINE_PATH, route(QuarantineBody, report)),  # peer
        web.post(READMIT_PATH, route(ReadmitBody, readmit)),  # peer
    ]
