"""The lock routes' paths, bodies, answers and documentation (POST /v1/locks/{name}/acquire|
renew|release, GET /v1/locks, and the voters' POST /v1/lockstore/prepare|accept)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from aiohttp import web
from annotated_types import Len
from pydantic import BaseModel, Field, JsonValue

from node.errors import BodyError, LockError
from node.locks.table import LOCK_ANSWER, LockState, LockTable, WireFence
from node.openapi import BODY_CONFIG, Count, RouteDoc, WholeNumber, WireRecord, parse_body

LOCKS_PATH = "/v1/locks"
PREPARE_PATH = "/v1/lockstore/prepare"
ACCEPT_PATH = "/v1/lockstore/accept"
DEFAULT_WAIT_S = 5.0
MAX_WAIT_S = 30.0
MAX_TTL_S = 7 * 86400.0
MAX_HOLDER_CHARS = 200

B = TypeVar("B", bound=BaseModel)


_HOLDER = Field(
    min_length=1, max_length=MAX_HOLDER_CHARS, description="who holds or asks: 1 to 200 characters"
)
Fence = Annotated[list[Count], Len(2, 2)]
_TERM = Field(ge=0, le=2**63 - 1, description="the coordinator's term")


class AcquireBody(BaseModel):
    """Body of `POST /v1/locks/{name}/acquire`."""

    model_config = BODY_CONFIG

    holder: str = _HOLDER
    ttl_s: float = Field(gt=0, le=MAX_TTL_S, description="the lease, seconds (at most 7 days)")
    wait: bool = Field(default=False, description="queue (FIFO) when the lock is held")
    wait_s: float = Field(
        default=DEFAULT_WAIT_S, gt=0, le=MAX_WAIT_S, description="how long to wait, seconds"
    )


class HolderBody(BaseModel):
    """Body of `POST /v1/locks/{name}/renew` and `.../release`."""

    model_config = BODY_CONFIG

    holder: str = _HOLDER
    fence: Fence | None = Field(default=None, description="[term, seq] of the grant held")


class PrepareBody(BaseModel):
    """Body of `POST /v1/lockstore/prepare`: the term a voter is asked to promise."""

    model_config = BODY_CONFIG

    term: WholeNumber = _TERM


class AcceptBody(BaseModel):
    """Body of `POST /v1/lockstore/accept`: a lock table to store under `term`; the table's
    inner shape is LockTable.to_dict's (LockTable.from_dict refuses any other: 400)."""

    model_config = BODY_CONFIG

    term: WholeNumber = _TERM
    table: dict[str, Any] = Field(description="LockTable.to_dict(): version, locks, runs")


LOCK_BODIES: Mapping[str, type[AcquireBody] | type[HolderBody]] = {
    "acquire": AcquireBody,
    "renew": HolderBody,
    "release": HolderBody,
}


def parse_lock_body(raw: bytes, operation: str) -> AcquireBody | HolderBody:
    """The body of an acquire/renew/release, checked by its model; LockError 400 naming the
    bad field."""
    return checked_body(LOCK_BODIES[operation], raw)


def checked_body(model: type[B], raw: bytes) -> B:
    try:
        return parse_body(model, raw)
    except BodyError as exc:
        raise LockError(400, "invalid_lock_request", exc.reason) from None


def lock_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not name or len(name) > MAX_HOLDER_CHARS:
        raise LockError(400, "invalid_lock_name", "a lock name of 1 to 200 characters")
    return name


class LockView(WireRecord):
    """The answer of `GET /v1/locks`: the coordinator and its lock table."""

    coordinator: str
    version: WireFence
    locks: dict[str, LockState]
    runs: dict[str, dict[str, JsonValue]] = Field(description="the runs' records (RunRecord)")
    drains: dict[str, dict[str, JsonValue]] = Field(
        default_factory=dict,
        description="the drained nodes (`shoal node drain`): node id -> kill_after_s, since, by",
    )


class Released(WireRecord):
    """The answer of a release."""

    name: str
    holder: str
    released: Literal[True] = True


class Promise(WireRecord):
    """A voter's answer to a prepare: the term it promised and the table it stores."""

    promised: int
    table: LockTable


class Stored(WireRecord):
    """A voter's answer to an accept: the version of the table it stored."""

    stored: WireFence


NAME_PARAMETER = (
    "name",
    "path",
    "the lock's name, 1 to 200 characters",
    {"type": "string", "minLength": 1, "maxLength": MAX_HOLDER_CHARS},
)
HOLDER_ANSWERS = (
    (400, "bad request"),
    (409, "not the holder, or a stale fence"),
    (503, "no quorum or coordinator"),
)


def lock_route_docs() -> list[RouteDoc]:
    """The documentation of the lock routes and of the voters' lock store routes."""
    name, common = NAME_PARAMETER, HOLDER_ANSWERS
    return [
        RouteDoc(
            "GET",
            LOCKS_PATH,
            "The cluster's locks (from the coordinator): holders, fences, leases, waiters",
            ((200, "the lock table"), (503, "no coordinator or no quorum")),
            response=LockView,
        ),
        RouteDoc(
            "POST",
            f"{LOCKS_PATH}/{{name}}/acquire",
            'Acquire {"holder", "ttl_s", "wait", "wait_s"}: granted with a fence [term, seq],'
            " or the position in the FIFO queue",
            ((200, "granted or queued"), *common),
            parameters=(name,),
            body=AcquireBody,
            response=LOCK_ANSWER.json_schema(),
        ),
        RouteDoc(
            "POST",
            f"{LOCKS_PATH}/{{name}}/renew",
            'Renew the holder\'s lease {"holder", "fence"}; 409 when the lock was lost',
            ((200, "renewed"), *common),
            parameters=(name,),
            body=HolderBody,
            response=LOCK_ANSWER.json_schema(),
        ),
        RouteDoc(
            "POST",
            f"{LOCKS_PATH}/{{name}}/release",
            'Release {"holder", "fence"}; the first waiter gets the lock',
            ((200, "released"), *common),
            parameters=(name,),
            body=HolderBody,
            response=Released,
        ),
        RouteDoc(
            "POST",
            PREPARE_PATH,
            'Voters only: promise term {"term"} and answer the stored lock table',
            ((200, "the table"), (400, "bad request"), (409, "a newer term was promised")),
            body=PrepareBody,
            response=Promise,
        ),
        RouteDoc(
            "POST",
            ACCEPT_PATH,
            'Voters only: store a lock table {"term", "table"} of the coordinator',
            ((200, "stored"), (400, "bad request"), (409, "a newer term was promised")),
            body=AcceptBody,
            response=Stored,
        ),
    ]
