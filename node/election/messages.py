"""The messages of coordinator election and their JSON form (the bodies of the HTTP endpoints
`POST /v1/election/vote` and `POST /v1/election/heartbeat` and their answers).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict, TypeGuard

from node.errors import ElectionError, PlanError
from node.plan import PlanFence, RolePlan, RolePlanJson

MAX_PLAN_SOURCES = 16
"""The most members a heartbeat names to fetch its plan from."""


class VoteRequestJson(TypedDict):
    type: Literal["vote_request"]
    term: int
    candidate: str
    pre_vote: bool


class VoteReplyJson(TypedDict):
    type: Literal["vote_reply"]
    term: int
    voter: str
    granted: bool
    pre_vote: bool
    reason: str


class HeartbeatJson(TypedDict):
    """`plan_digest` and `plan_sources` only to a receiver that pulls plans."""

    type: Literal["heartbeat"]
    term: int
    coordinator: str
    seq: int
    plan_fence: list[int] | None
    plan: RolePlanJson | None
    plan_digest: NotRequired[str]
    plan_sources: NotRequired[list[str]]


class HeartbeatAckJson(TypedDict):
    """`pulls_plans` only when true (the previous release never sends it)."""

    type: Literal["heartbeat_ack"]
    term: int
    node: str
    seq: int
    success: bool
    plan_fence: list[int] | None
    generation: int
    pulls_plans: NotRequired[Literal[True]]


class PlanAnnounceJson(TypedDict):
    type: Literal["plan_announce"]
    node: str
    term: int
    coordinator: str | None
    lease_valid: bool
    plan: RolePlanJson | None


class VoteReason(enum.StrEnum):
    """Why a vote was granted or denied (carried in VoteReply.reason)."""

    GRANTED = "granted"
    STALE_TERM = "stale_term"
    ALREADY_VOTED = "already_voted"
    LEASE = "lease"
    NOT_VOTER = "not_voter"
    UNKNOWN_CANDIDATE = "unknown_candidate"


@dataclass(frozen=True, slots=True)
class VoteRequest:
    """`candidate` asks for a vote in `term`. A pre-vote asks "would you vote for me in `term`?"
    without anyone changing state; a real election follows only a majority of pre-votes."""

    term: int
    candidate: str
    pre_vote: bool = False

    def to_dict(self) -> VoteRequestJson:
        return {
            "type": "vote_request",
            "term": self.term,
            "candidate": self.candidate,
            "pre_vote": self.pre_vote,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> VoteRequest:
        _expect_type(data, "vote_request")
        return cls(_int(data, "term"), _text(data, "candidate"), _bool(data, "pre_vote"))


@dataclass(frozen=True, slots=True)
class VoteReply:
    """`voter`'s answer. `term` is the voter's current term (a candidate behind it steps down),
    except in a granted pre-vote, where it echoes the term asked about."""

    term: int
    voter: str
    granted: bool
    pre_vote: bool = False
    reason: str = VoteReason.GRANTED.value

    def to_dict(self) -> VoteReplyJson:
        return {
            "type": "vote_reply",
            "term": self.term,
            "voter": self.voter,
            "granted": self.granted,
            "pre_vote": self.pre_vote,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> VoteReply:
        _expect_type(data, "vote_reply")
        reason = data.get("reason", "")
        return cls(
            _int(data, "term"),
            _text(data, "voter"),
            _bool(data, "granted", required=True),
            _bool(data, "pre_vote"),
            reason if isinstance(reason, str) else "",
        )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The coordinator of `term` is alive. `seq` numbers its rounds; `plan_fence` is its current
    plan's fence and `plan` the whole plan when the receiver has not acknowledged that fence.

    Instead of the plan, a receiver that pulls plans (its acknowledgements say `pulls_plans`)
    gets `plan_digest` (the plan's `RolePlan.digest`) and `plan_sources`, the members to fetch
    it from in order (`GET /v1/plan?fence=`, node.election.pull); both keys are absent
    otherwise, so a heartbeat reads as the previous release's."""

    term: int
    coordinator: str
    seq: int
    plan_fence: PlanFence | None = None
    plan: RolePlan | None = None
    plan_digest: str | None = None
    plan_sources: tuple[str, ...] = ()

    def to_dict(self) -> HeartbeatJson:
        data: HeartbeatJson = {
            "type": "heartbeat",
            "term": self.term,
            "coordinator": self.coordinator,
            "seq": self.seq,
            "plan_fence": None if self.plan_fence is None else self.plan_fence.to_list(),
            "plan": None if self.plan is None else self.plan.to_dict(),
        }
        if self.plan_digest is not None:
            data["plan_digest"] = self.plan_digest
            data["plan_sources"] = list(self.plan_sources)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Heartbeat:
        _expect_type(data, "heartbeat")
        try:
            fence = PlanFence.from_value(data.get("plan_fence"))
            plan = _plan(data.get("plan"))
        except PlanError as exc:
            raise ElectionError(f"heartbeat carries a bad plan: {exc}") from exc
        if plan is not None and plan.fence != fence:
            raise ElectionError("heartbeat plan_fence does not match its plan")
        digest, sources = _digest(data.get("plan_digest")), data.get("plan_sources") or []
        if not isinstance(sources, list) or len(sources) > MAX_PLAN_SOURCES:
            raise ElectionError(f"heartbeat plan_sources must list at most {MAX_PLAN_SOURCES}")
        named = tuple(_text({"source": source}, "source") for source in sources)
        return cls(
            _int(data, "term"),
            _text(data, "coordinator"),
            _int(data, "seq"),
            fence,
            plan,
            digest if fence is not None else None,
            named if digest is not None and fence is not None else (),
        )


@dataclass(frozen=True, slots=True)
class HeartbeatAck:
    """`node` answers heartbeat `seq`: `success` when it follows that coordinator in `term`
    (its own term, higher when the heartbeat was stale); `plan_fence` is the plan it applies,
    `generation` the highest training generation it has seen; `pulls_plans` that it fetches a
    new plan from the members a heartbeat names (the previous release never says so)."""

    term: int
    node: str
    seq: int
    success: bool
    plan_fence: PlanFence | None = None
    generation: int = 0
    pulls_plans: bool = False

    def to_dict(self) -> HeartbeatAckJson:
        data: HeartbeatAckJson = {
            "type": "heartbeat_ack",
            "term": self.term,
            "node": self.node,
            "seq": self.seq,
            "success": self.success,
            "plan_fence": None if self.plan_fence is None else self.plan_fence.to_list(),
            "generation": self.generation,
        }
        if self.pulls_plans:
            data["pulls_plans"] = True
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> HeartbeatAck:
        _expect_type(data, "heartbeat_ack")
        try:
            fence = PlanFence.from_value(data.get("plan_fence"))
        except PlanError as exc:
            raise ElectionError(f"heartbeat ack carries a bad fence: {exc}") from exc
        return cls(
            _int(data, "term"),
            _text(data, "node"),
            _int(data, "seq"),
            _bool(data, "success", required=True),
            fence,
            _int(data, "generation") if "generation" in data else 0,
            data.get("pulls_plans") is True,
        )


@dataclass(frozen=True, slots=True)
class PlanAnnounce:
    """What a node knows of the current plan: the `GET /v1/plan` document."""

    node: str
    term: int
    coordinator: str | None
    lease_valid: bool
    plan: RolePlan | None

    def to_dict(self) -> PlanAnnounceJson:
        return {
            "type": "plan_announce",
            "node": self.node,
            "term": self.term,
            "coordinator": self.coordinator,
            "lease_valid": self.lease_valid,
            "plan": None if self.plan is None else self.plan.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> PlanAnnounce:
        _expect_type(data, "plan_announce")
        coordinator = data.get("coordinator")
        try:
            plan = _plan(data.get("plan"))
        except PlanError as exc:
            raise ElectionError(f"plan document is malformed: {exc}") from exc
        return cls(
            _text(data, "node"),
            _int(data, "term"),
            coordinator if isinstance(coordinator, str) else None,
            _bool(data, "lease_valid"),
            plan,
        )


Request = VoteRequest | Heartbeat
Reply = VoteReply | HeartbeatAck
Message = VoteRequest | VoteReply | Heartbeat | HeartbeatAck


@dataclass(frozen=True, slots=True)
class Outbound:
    """A message the election core wants delivered to node `to`."""

    to: str
    message: Message


_PARSERS: dict[str, Callable[[Mapping[str, object]], Message]] = {
    "vote_request": VoteRequest.from_dict,
    "vote_reply": VoteReply.from_dict,
    "heartbeat": Heartbeat.from_dict,
    "heartbeat_ack": HeartbeatAck.from_dict,
}


def message_from_dict(data: object) -> Message:
    """Any election message from its JSON object (dispatch on `type`); ElectionError if bad."""
    if not isinstance(data, Mapping):
        raise ElectionError(f"election message must be an object, not {type(data).__name__}")
    parser = _PARSERS.get(str(data.get("type")))
    if parser is None:
        raise ElectionError(f"unknown election message type {data.get('type')!r}")
    return parser(data)


def _digest(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 64):
        raise ElectionError("heartbeat plan_digest must be a short string")
    return value


def _plan(data: object) -> RolePlan | None:
    """The plan of a message's `plan` (None: none); PlanError when it is not a plan."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise PlanError(f"plan must be an object, not {type(data).__name__}")
    return RolePlan.from_dict(data)


def _expect_type(data: Mapping[str, object], expected: str) -> None:
    if not isinstance(data, Mapping):
        raise ElectionError(f"{expected} must be an object, not {type(data).__name__}")
    if data.get("type", expected) != expected:
        raise ElectionError(f"expected a {expected}, got type {data.get('type')!r}")


def _int(data: Mapping[str, object], key: str) -> int:
    value = data.get(key)
    if not _is_int(value) or value < 0:
        raise ElectionError(f"election message field {key!r} must be an integer >= 0")
    return value


def _text(data: Mapping[str, object], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value or len(value) > 128:
        raise ElectionError(f"election message field {key!r} must be a node id (1-128 chars)")
    return value


def _bool(data: Mapping[str, object], key: str, required: bool = False) -> bool:
    value = data.get(key) if required else data.get(key, False)
    if not isinstance(value, bool):
        raise ElectionError(f"election message field {key!r} must be true or false")
    return value


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
