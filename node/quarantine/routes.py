"""The GPU quarantine routes (POST /v1/gpu/quarantine|readmit), declared on their handlers: read
the body, check that a node speaks for its own GPUs, forward to the coordinator like drains,
answer its QuarantineAnswer. A LockError is answered by the node's error middleware (503 with
`Retry-After: 1`)."""

from __future__ import annotations

from aiohttp import web

from config.declare import Caller, Refusal, route
from node.access import FORWARDED_HEADER
from node.errors import LockError
from node.locks.routes import NO_QUORUM, checked_body, forward_to_coordinator
from node.quarantine.service import QuarantineService
from node.quarantine.wire import (
    QUARANTINE_PATH,
    READMIT_PATH,
    QuarantineAnswer,
    QuarantineBody,
    ReadmitBody,
)
from node.security import is_client_id, request_sender

ERRORS = (
    Refusal(400, "invalid_lock_request", "bad request"),
    Refusal(403, "not_your_gpu", "a node reports only its own GPUs; clients may not report"),
    NO_QUORUM,
)


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


class QuarantineRoutes:
    """POST /v1/gpu/quarantine and POST /v1/gpu/readmit, at the coordinator or forwarded to
    it; only nodes call them, each about its own GPUs."""

    def __init__(self, service: QuarantineService) -> None:
        self.service = service

    async def _read(
        self, request: web.Request, model: type[QuarantineBody] | type[ReadmitBody]
    ) -> tuple[QuarantineBody | ReadmitBody, web.Response | None]:
        body = checked_body(model, await request.read())
        check_own(request, body.node)
        return body, await forward_to_coordinator(self.service.locks, request, body.model_dump())

    @route(
        "POST",
        QUARANTINE_PATH,
        callers=[Caller.PEER],
        answers=((200, "quarantined (or already was)"),),
        errors=ERRORS,
        body=QuarantineBody,
        answer=QuarantineAnswer,
    )
    async def report(self, request: web.Request) -> web.Response:
        """The calling node reports a fault of its own GPU {"node", "gpu", "fault", "reason"};
        the coordinator quarantines it (kept on a majority of the voters): it leaves the
        training group in the next plan, with the reason in cannot_train. Repeating it changes
        nothing"""
        body, forwarded = await self._read(request, QuarantineBody)
        if forwarded is not None:
            return forwarded
        assert isinstance(body, QuarantineBody)
        return web.json_response((await self.service.report(body)).to_json())

    @route(
        "POST",
        READMIT_PATH,
        callers=[Caller.PEER],
        answers=((200, "re-admitted (or was not quarantined)"),),
        errors=[*ERRORS, Refusal(409, "quarantine_held", "held: shoal node undrain lifts it")],
        body=ReadmitBody,
        answer=QuarantineAnswer,
    )
    async def readmit(self, request: web.Request) -> web.Response:
        """The calling node, whose GPUs passed a self-test {"node", "selftest"}, asks to be
        re-admitted; it trains again from the next plan"""
        body, forwarded = await self._read(request, ReadmitBody)
        if forwarded is not None:
            return forwarded
        assert isinstance(body, ReadmitBody)
        return web.json_response((await self.service.readmit(body)).to_json())
