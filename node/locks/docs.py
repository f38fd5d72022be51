"""The lock routes' paths, bodies, answers and documentation (POST /v1/locks/{name}/acquire|
renew|release, GET /v1/locks, and the voters' POST /v1/lockstore/prepare|accept), and those of
the node routes (POST /v1/nodes/{node}/drain|undrain|leave)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from annotated_types import Len
from pydantic import BaseModel, Field, JsonValue

from node.locks.table import LOCK_ANSWER, LockState, LockTable, Quarantine, WireFence
from node.openapi import BODY_CONFIG, Count, RouteDoc, WholeNumber, WireRecord

LOCKS_PATH = "/v1/locks"
PREPARE_PATH = "/v1/lockstore/prepare"
ACCEPT_PATH = "/v1/lockstore/accept"
DEFAULT_WAIT_S = 5.0
MAX_WAIT_S = 30.0
MAX_TTL_S = 7 * 86400.0
MAX_HOLDER_CHARS = 200
NODES_PATH = "/v1/nodes"
MAX_KILL_AFTER_S = 30 * 86400.0

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
    quarantines: dict[str, Quarantine] = Field(
        default_factory=dict,
        description="the nodes quarantined for a GPU fault, and those re-admitted within the "
        "hour (docs/fault-tolerance.md#gpu-faults)",
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


class DrainBody(BaseModel):
    """POST /v1/nodes/{node}/drain: kill the node's running jobs after `kill_after_s` seconds
    (null: let them finish)."""

    model_config = BODY_CONFIG

    kill_after_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_KILL_AFTER_S,
        description="seconds after which the node's running jobs are killed; null: they finish",
    )


class NodeBody(BaseModel):
    """Body of `POST /v1/nodes/{node}/undrain` and `.../leave` (optional): an empty object."""

    model_config = BODY_CONFIG


NODE_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
    "description": "a node id: 1 to 63 letters, digits, '.', '_' or '-', the first not '.', "
    "'_' or '-'",
}


DRAIN_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["node", "draining", "coordinator", "plan", "applied"],
    "properties": {
        "node": {"type": "string"},
        "draining": {"type": "boolean"},
        "kill_after_s": {"type": ["number", "null"]},
        "coordinator": {"type": "string"},
        "plan": {
            "description": "the fence [term, version] of the first plan with this change",
            "type": ["array", "null"],
            "items": {"type": "integer"},
        },
        "applied": {
            "type": "boolean",
            "description": "the node acknowledged that plan (false: it is not reachable now)",
        },
    },
}
LEAVE_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["node", "leaving"],
    "properties": {"node": {"type": "string"}, "leaving": {"const": True}},
}


def node_route_docs() -> list[RouteDoc]:
    """The documentation of the drain, undrain and leave routes."""
    node = ("node", "path", "the node's id", NODE_ID_SCHEMA)
    return [
        RouteDoc(
            "POST",
            f"{NODES_PATH}/{{node}}/drain",
            'Drain a node {"kill_after_s"}: no new job, gang member, training rank, weights '
            "place or actor goes there; its running jobs finish (or are killed after "
            "kill_after_s). Kept on a majority of the voters; answered by the coordinator "
            "once a plan carries it",
            (
                (200, "drained"),
                (400, "bad request"),
                (404, "no such member"),
                (503, "no coordinator or no quorum of voters"),
            ),
            parameters=(node,),
            body=DrainBody,
            body_optional=True,
            response=DRAIN_ANSWER,
        ),
        RouteDoc(
            "POST",
            f"{NODES_PATH}/{{node}}/undrain",
            "Undrain a node: it takes new work again from the next plan; also lifts its GPU "
            "quarantine (held or not)",
            (
                (200, "undrained (or was not drained)"),
                (400, "bad request"),
                (503, "no coordinator or no quorum of voters"),
            ),
            parameters=(node,),
            body=NodeBody,
            body_optional=True,
            response=DRAIN_ANSWER,
        ),
        RouteDoc(
            "POST",
            f"{NODES_PATH}/{{node}}/leave",
            "Make a node leave the cluster: it gossips `left` (every peer shows it left "
            "at once, with no suspicion), then its daemon stops",
            (
                (202, "the node leaves"),
                (400, "bad request"),
                (404, "no such alive member"),
                (503, "the node cannot be reached"),
            ),
            parameters=(node,),
            body=NodeBody,
            body_optional=True,
            response=LEAVE_ANSWER,
        ),
    ]
