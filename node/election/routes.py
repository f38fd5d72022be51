"""Election over HTTP: the routes (`POST /v1/election/vote`, `POST /v1/election/heartbeat`,
`GET /v1/plan`); node.election.transport is the client that calls them. The fence check of
role-dependent routes is fence.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from config.declare import READ, Caller, Refusal, route
from config.wire import STATUS_CODES
from node.election.elector import Elector
from node.election.messages import (
    MAX_PLAN_SOURCES,
    Heartbeat,
    VoteRequest,
)
from node.election.pull import PlanQuery, plan_query, serve_plan
from node.errors import AnsweredError, ElectionError
from node.identity.roles import caller_of
from node.openapi import WireRecord
from node.security import PEER_ID

log = logging.getLogger(__name__)
T = TypeVar("T")
M = TypeVar("M")

VOTE_PATH = "/v1/election/vote"
HEARTBEAT_PATH = "/v1/election/heartbeat"
PLAN_PATH = "/v1/plan"
MAX_ELECTION_BODY_BYTES = 4 * 1024 * 1024


def _whole(value: Any) -> Any:
    """3.0 is the integer 3 in JSON Schema; the messages carry it as 3."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


_TERM = Field(ge=0, le=2**63 - 1)
WholeNumber = Annotated[int, BeforeValidator(_whole)]
_NODE_ID = Field(min_length=1, max_length=128)


class VoteRequestBody(BaseModel):
    """Body of `POST /v1/election/vote` (VoteRequest's JSON form)."""

    model_config = ConfigDict(strict=True)

    type: Literal["vote_request"] = "vote_request"
    term: WholeNumber = _TERM
    candidate: str = _NODE_ID
    pre_vote: bool = False


class HeartbeatBody(BaseModel):
    """Body of `POST /v1/election/heartbeat` (Heartbeat's JSON form); the plan is checked
    further by RolePlan.from_dict."""

    model_config = ConfigDict(strict=True)

    type: Literal["heartbeat"] = "heartbeat"
    term: WholeNumber = _TERM
    coordinator: str = _NODE_ID
    seq: WholeNumber = _TERM
    plan_fence: Annotated[list[WholeNumber], Field(min_length=2, max_length=2)] | None = None
    plan: dict[str, Any] | None = None
    plan_digest: str | None = Field(default=None, min_length=1, max_length=64)
    plan_sources: list[str] | None = Field(default=None, max_length=MAX_PLAN_SOURCES)


class VoteReplyAnswer(WireRecord):
    """A voter's reply: granted or not, and why."""

    type: Literal["vote_reply"]
    term: int
    voter: str
    granted: bool
    pre_vote: bool
    reason: str


class AckAnswer(WireRecord):
    """A node's acknowledgement of a heartbeat, with the plan it applies."""

    type: Literal["heartbeat_ack"]
    term: int
    node: str
    seq: int
    success: bool
    plan_fence: list[int] | None = None
    generation: int | None = None


class PlanAnswer(WireRecord):
    """This node's term, coordinator, lease and the role plan it applies."""

    type: Literal["plan_announce"]
    node: str
    term: int
    coordinator: str | None
    lease_valid: bool
    plan: dict[str, Any] | None


MESSAGE_ERRORS = (
    Refusal(400, "bad_request", "malformed request"),
    Refusal(403, "forbidden", "signer is not the sender"),
    Refusal(413, "too_large", "message too large"),
    Refusal(503, "unavailable", "election not running, or its state cannot be stored"),
)

ElectorSource = Callable[[], Elector | None]
AddressOf = Callable[[str], tuple[str, int] | None]


class ElectionRoutes:
    """The election routes; `elector()` is the running Elector, or None (answered 503)."""

    def __init__(self, elector: ElectorSource) -> None:
        self._elector = elector

    @route(
        "POST",
        VOTE_PATH,
        callers=[Caller.PEER],
        answers=((200, "the vote reply"),),
        errors=MESSAGE_ERRORS,
        body=VoteRequestBody,
        answer=VoteReplyAnswer,
    )
    async def vote(self, request: web.Request) -> web.Response:
        """A candidate asks for a (pre-)vote; the answer is durable before it is sent"""
        running = _running(self._elector)
        message = await _message(request, VoteRequestBody, VoteRequest.from_dict)
        _check_sender(request, message.candidate)
        return web.json_response((await _answer(running.handle_vote_request(message))).to_dict())

    @route(
        "POST",
        HEARTBEAT_PATH,
        callers=[Caller.PEER],
        answers=((200, "the acknowledgement"),),
        errors=MESSAGE_ERRORS,
        body=HeartbeatBody,
        answer=AckAnswer,
    )
    async def heartbeat(self, request: web.Request) -> web.Response:
        """The coordinator's heartbeat, carrying its plan; answered with an acknowledgement"""
        running = _running(self._elector)
        message = await _message(request, HeartbeatBody, Heartbeat.from_dict)
        _check_sender(request, message.coordinator)
        return web.json_response((await _answer(running.handle_heartbeat(message))).to_dict())

    @route(
        "GET",
        PLAN_PATH,
        callers=READ,
        answers=((200, "the plan document"),),
        errors=[
            Refusal(400, "bad_request", "malformed fence or wait_s"),
            Refusal(403, "forbidden", "fence given by a caller that is not a node"),
            Refusal(404, "plan_not_here", "this node does not apply that plan (yet)"),
            Refusal(503, "unavailable", "election not running"),
        ],
        query=PlanQuery,
        answer=PlanAnswer,
    )
    async def plan(self, request: web.Request) -> web.Response:
        """This node's term, coordinator, lease and the role plan it applies; with `fence`
        (peers only: a node fetching the plan a heartbeat announced, node.election.pull) that
        plan once this node applies it, waiting up to `wait_s`"""
        running = _running(self._elector)
        asked = plan_query(request.query)
        if asked.fence is None:
            return web.json_response(running.plan_announce().to_dict())
        caller = caller_of(request)
        if caller is not None and caller is not Caller.PEER:
            raise _Refusal(403, f"only nodes fetch a plan by fence, not a {caller.value} caller")
        return await serve_plan(running, asked)


async def _message(
    request: web.Request, model: type[BaseModel], parse: Callable[[Mapping[str, object]], M]
) -> M:
    """The request's election message: checked against `model`, then `parse`d (400 when
    either refuses it)."""
    data = await _read_message(request, model)
    try:
        return parse(data)
    except ElectionError as exc:
        raise _Refusal(400, str(exc)) from exc


class _Refusal(AnsweredError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(status, STATUS_CODES[status], reason)


def _running(elector: ElectorSource) -> Elector:
    running = elector()
    if running is None:
        raise _Refusal(503, "election is not running on this node")
    return running


async def _read_message(request: web.Request, model: type[BaseModel]) -> dict[str, object]:
    """The message's JSON object, checked against `model` (the document's schema of it)."""
    if request.content_length is not None and request.content_length > MAX_ELECTION_BODY_BYTES:
        raise _Refusal(413, f"election messages are at most {MAX_ELECTION_BODY_BYTES} bytes")
    try:
        data = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Refusal(400, f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _Refusal(400, "an election message is a JSON object")
    try:
        checked = model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"]) or "body"
        raise _Refusal(400, f"{model.__name__} {where}: {error['msg']}") from None
    return {**data, **checked.model_dump(exclude_unset=True)}


def _check_sender(request: web.Request, sender: str) -> None:
    signer = request.get(PEER_ID)
    if signer is not None and signer != sender:
        raise _Refusal(403, f"request signed by {signer!r} speaks for {sender!r}")


async def _answer(pending: Awaitable[T]) -> T:
    try:
        return await pending
    except ElectionError as exc:
        raise _Refusal(503, str(exc)) from exc
    except Exception as exc:  # the durable store failed: no answer is the safe answer
        log.warning("election request failed: %r", exc)
        raise _Refusal(503, f"cannot store election state: {exc}") from exc
