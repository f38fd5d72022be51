"""Election messages as JSON: exact wire forms, round trips, malformed input refused."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest

from config import Role
from node.election.messages import (
    Heartbeat,
    HeartbeatAck,
    HeartbeatAckJson,
    HeartbeatJson,
    PlanAnnounce,
    PlanAnnounceJson,
    VoteReply,
    VoteReplyJson,
    VoteRequest,
    VoteRequestJson,
    message_from_dict,
)
from node.errors import ElectionError
from node.plan import GroupSpec, PlanFence, RolePlan

PLAN = RolePlan(
    term=3,
    version=2,
    roles={"a": Role.TRAINING, "b": Role.INFERENCE},
    training_ranks=("a",),
    group=GroupSpec("10.0.0.1", 29500, 1, "nccl"),
)


def test_wire_forms() -> None:
    assert VoteRequest(4, "a", pre_vote=True).to_dict() == {
        "type": "vote_request",
        "term": 4,
        "candidate": "a",
        "pre_vote": True,
    }
    assert VoteReply(4, "b", False, False, "lease").to_dict() == {
        "type": "vote_reply",
        "term": 4,
        "voter": "b",
        "granted": False,
        "pre_vote": False,
        "reason": "lease",
    }
    assert Heartbeat(3, "a", 17, PLAN.fence, PLAN).to_dict() == {
        "type": "heartbeat",
        "term": 3,
        "coordinator": "a",
        "seq": 17,
        "plan_fence": [3, 2],
        "plan": PLAN.to_dict(),
    }
    assert HeartbeatAck(3, "b", 17, True, None).to_dict() == {
        "type": "heartbeat_ack",
        "term": 3,
        "node": "b",
        "seq": 17,
        "success": True,
        "plan_fence": None,
        "generation": 0,
    }


@pytest.mark.parametrize(
    "message",
    [
        VoteRequest(1, "a"),
        VoteRequest(9, "node-with-dashes", pre_vote=True),
        VoteReply(9, "b", True, True),
        VoteReply(9, "b", False, False, "already_voted"),
        Heartbeat(3, "a", 1),
        Heartbeat(3, "a", 2, PLAN.fence),
        Heartbeat(3, "a", 3, PLAN.fence, PLAN),
        HeartbeatAck(3, "b", 3, False),
        HeartbeatAck(3, "b", 3, True, PlanFence(3, 2)),
    ],
)
def test_round_trip_through_json(
    message: VoteRequest | VoteReply | Heartbeat | HeartbeatAck,
) -> None:
    text = json.dumps(message.to_dict())
    assert message_from_dict(json.loads(text)) == message
    assert type(message).from_dict(json.loads(text)) == message


def test_the_wire_forms_have_the_keys_their_typed_dicts_declare() -> None:
    pulled = Heartbeat(3, "a", 4, PLAN.fence, None, "d" * 64, ("b", "c"))
    forms = [
        (VoteRequest(1, "a").to_dict(), VoteRequestJson),
        (VoteReply(1, "b", True).to_dict(), VoteReplyJson),
        (pulled.to_dict(), HeartbeatJson),
        (HeartbeatAck(3, "b", 3, True, pulls_plans=True).to_dict(), HeartbeatAckJson),
        (PlanAnnounce("b", 3, "a", True, PLAN).to_dict(), PlanAnnounceJson),
    ]
    for data, typed in forms:
        assert set(data) == set(typing.get_type_hints(typed)), typed.__name__
    assert pulled.to_dict()["plan_sources"] == ["b", "c"]
    assert "pulls_plans" not in HeartbeatAck(3, "b", 3, True).to_dict()
    assert "plan_digest" not in Heartbeat(3, "a", 4, PLAN.fence).to_dict()


def test_plan_announce_round_trip() -> None:
    announce = PlanAnnounce("b", 3, "a", True, PLAN)
    assert PlanAnnounce.from_dict(json.loads(json.dumps(announce.to_dict()))) == announce
    empty = PlanAnnounce("b", 0, None, False, None)
    assert PlanAnnounce.from_dict(empty.to_dict()) == empty


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([], "must be an object"),
        ({"type": "gossip"}, "unknown election message type"),
        ({"type": "vote_request", "term": -1, "candidate": "a"}, "term"),
        ({"type": "vote_request", "term": True, "candidate": "a"}, "term"),
        ({"type": "vote_request", "term": 1, "candidate": ""}, "candidate"),
        ({"type": "vote_request", "term": 1, "candidate": "a" * 129}, "candidate"),
        ({"type": "vote_request", "term": 1, "candidate": "a", "pre_vote": "yes"}, "pre_vote"),
        ({"type": "vote_reply", "term": 1, "voter": "b"}, "granted"),
        ({"type": "heartbeat", "term": 1, "coordinator": "a", "seq": 1, "plan_fence": [1]}, "plan"),
        (
            {
                "type": "heartbeat",
                "term": 3,
                "coordinator": "a",
                "seq": 1,
                "plan_fence": [3, 1],
                "plan": PLAN.to_dict(),
            },
            "does not match",
        ),
        (
            {
                "type": "heartbeat",
                "term": 3,
                "coordinator": "a",
                "seq": 1,
                "plan_fence": [3, 2],
                "plan": {**PLAN.to_dict(), "roles": {"a": "king"}},
            },
            "bad plan",
        ),
        (
            {
                "type": "heartbeat",
                "term": 3,
                "coordinator": "a",
                "seq": 1,
                "plan_fence": [3, 2],
                "plan": ["a"],
            },
            "bad plan: plan must be an object, not list",
        ),
        (
            {
                "type": "heartbeat",
                "term": 3,
                "coordinator": "a",
                "seq": 1,
                "plan_fence": [3, 2],
                "plan_digest": 7,
                "plan_sources": ["b"],
            },
            "plan_digest",
        ),
        ({"type": "heartbeat_ack", "term": 1, "node": "b", "seq": 1, "success": 1}, "success"),
        (
            {
                "type": "heartbeat_ack",
                "term": 1,
                "node": "b",
                "seq": 1,
                "success": True,
                "generation": -2,
            },
            "generation",
        ),
    ],
)
def test_malformed_messages_are_refused(data: Any, match: str) -> None:
    with pytest.raises(ElectionError, match=match):
        message_from_dict(data)


def test_from_dict_checks_the_type_field() -> None:
    with pytest.raises(ElectionError, match="expected a heartbeat"):
        Heartbeat.from_dict(VoteRequest(1, "a").to_dict())
    # the type field may be left out when the endpoint already says what it is
    assert VoteRequest.from_dict({"term": 2, "candidate": "a"}) == VoteRequest(2, "a")


def test_a_malformed_plan_announce_is_refused() -> None:
    with pytest.raises(ElectionError, match="plan must be an object"):
        PlanAnnounce.from_dict({"node": "b", "term": 3, "lease_valid": True, "plan": "x"})
