"""The lock routes' paths, bodies and answers (POST /v1/locks/{name}/acquire|renew|release,
GET /v1/locks, and the voters' POST /v1/lockstore/prepare|accept), and those of the node routes
(POST /v1/nodes/{node}/drain|undrain|leave)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from annotated_types import Len
from pydantic import BaseModel, Field

from node.locks.table import Drain, LockState, LockTable, Quarantine, StoredRun, WireFence
from node.openapi import BODY_CONFIG, Count, WholeNumber, WireRecord

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
    runs: dict[str, StoredRun] = Field(description="the runs' records (RunRecord)")
    drains: dict[str, Drain] = Field(
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


NODE_PARAMETER = (
    "node",
    "path",
    "the node's id",
    {
        "type": "string",
        "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        "description": "a node id: 1 to 63 letters, digits, '.', '_' or '-', the first not "
        "'.', '_' or '-'",
    },
)


class DrainAnswer(WireRecord):
    """The answer of a drain or an undrain, from the coordinator."""

    node: str
    draining: bool
    kill_after_s: float | None = None
    coordinator: str
    plan: list[int] | None = Field(
        description="the fence [term, version] of the first plan with this change"
    )
    applied: bool = Field(
        description="the node acknowledged that plan (false: it is not reachable now)"
    )


class LeaveAnswer(WireRecord):
    """The answer of a leave: the node leaves."""

    node: str
    leaving: Literal[True] = True
