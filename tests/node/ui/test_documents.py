"""The dashboard topics' documents are what their TypedDicts (node.ui.documents) say, key for
key and type for type, and a member's weights answer of the wrong shape is refused by field."""

from __future__ import annotations

import time
import types
import typing
from dataclasses import dataclass
from typing import Any, cast

import pytest
from pydantic import JsonValue

from health.monitor.model import NodeStatusDoc, parse_status
from node.plan import GroupSpec, RolePlan
from node.rl.offers import DigestRecord, WeightsStatus
from node.rl.service import RunWeights, WeightsService
from node.runtime import NodeRuntime
from node.ui.documents import AppliedWeights, MemberRow, RlTopic
from node.ui.peers import Known, Peer, PeerClient, ask_weights
from node.ui.topics import UiSources, member_rows, rl_topic
from tests.node.ui.test_peers import FakeMember as Member
from tests.node.ui.test_peers import FakeRuntime as Runtime
from tests.node.ui.test_peers import FakeView as View


@dataclass
class Weights:
    states: dict[str, RunWeights]

    def runs(self) -> dict[str, RunWeights]:
        return dict(self.states)


def conforms(value: object, hint: Any, where: str = "") -> None:
    """Assert `value` is of the JSON type `hint` (a TypedDict: exactly its keys, the required
    ones present), naming where it is not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if typing.is_typeddict(hint):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        hints = typing.get_type_hints(hint)
        assert set(value) <= set(hints), f"{where}: keys {set(value) - set(hints)} not declared"
        assert hint.__required_keys__ <= set(value), f"{where}: missing keys"
        for key, item in value.items():
            conforms(item, hints[key], f"{where}.{key}")
    elif hint is JsonValue:
        return
    elif origin in (types.UnionType, typing.Union):
        errors = []
        for arg in args:
            try:
                conforms(value, arg, where)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError("; ".join(errors))
    elif origin is list:
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for i, item in enumerate(value):
            conforms(item, args[0], f"{where}[{i}]")
    elif origin is dict:
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        for key, item in value.items():
            conforms(key, args[0], f"{where} key")
            conforms(item, args[1], f"{where}[{key!r}]")
    elif hint is type(None):
        assert value is None, f"{where}: {value!r} is not null"
    elif hint is float:
        assert type(value) in (int, float), f"{where}: {value!r} is not a number"
    else:
        assert type(value) is hint, f"{where}: {value!r} is not {hint.__name__}"


def test_the_checker_names_what_does_not_conform() -> None:
    with pytest.raises(AssertionError, match="incarnation"):
        conforms({"node_id": "a", "incarnation": "3"}, MemberRow)
    with pytest.raises(AssertionError, match="not declared"):
        conforms({"version": 1, "applied_at": None, "source": None, "bytes": 1}, AppliedWeights)


def test_a_member_row_is_a_member_row_key_for_key() -> None:
    members = [Member("here", is_self=True), Member("gpu-1"), Member("gpu-2", state="dead")]
    group = GroupSpec("", 0, 0, "gloo")
    plan = RolePlan(2, 1, {}, (), group, draining={"gpu-2": 30.0})
    sources = UiSources(cast(NodeRuntime, Runtime("here", View(members))), lambda: plan)
    gpu = {"index": 0, "name": "H100", "uuid": "GPU-0", "error": False, "util_pct": 12.0}
    doc = {"node_id": "gpu-1", "version": "1.4.2", "health": "healthy", "gpus": [gpu]}
    statuses = {"gpu-1": Known[NodeStatusDoc](parse_status(doc), time.time(), None)}
    rows = member_rows(sources, statuses)
    for row in rows:
        assert set(row) == set(typing.get_type_hints(MemberRow))
        conforms(row, MemberRow, row["node_id"])
    by_id = {row["node_id"]: row for row in rows}
    assert by_id["gpu-1"]["gpu_list"] == [
        {"index": 0, "name": "H100", "util_pct": 12.0, "memory_used_mb": None,
         "memory_total_mb": None, "temperature_c": None, "healthy": True, "problems": []}
    ]  # fmt: skip
    assert by_id["gpu-2"]["drain"] == {"kill_after_s": 30.0}


async def test_the_rl_topic_is_an_rl_topic() -> None:
    applied = WeightsStatus(
        run="r1",
        version=3,
        digest=DigestRecord(algo="sha256", value="ab" * 32),
        applied_at=5.0,
        source="file",
        bytes=1,
    )
    runtime = Runtime("here", View([Member("here", is_self=True)]))
    weights = Weights({"r1": RunWeights(status=applied)})
    sources = UiSources(
        cast(NodeRuntime, runtime), lambda: None, weights=cast(WeightsService, weights)
    )
    topic = await rl_topic(sources)
    conforms(topic, RlTopic, "rl")
    assert set(topic) == set(typing.get_type_hints(RlTopic))
    assert topic["nodes"]["here"] == {
        "runs": {"r1": {"version": 3, "applied_at": 5.0, "source": "file"}},
        "answered_at": None,
        "stale": False,
        "error": None,
    }


class AnswerOnce:
    """A PeerClient whose GET /v1/weights/runs answers `runs`."""

    def __init__(self, runs: object) -> None:
        self.runs = runs

    async def get_json(self, peer: Peer, path: str, *args: object, **kwargs: object) -> object:
        return {"runs": self.runs}


@pytest.mark.parametrize(
    ("status", "field_name"),
    [
        ({"applied_at": 1.0, "source": "file"}, "version"),
        ({"version": 2, "applied_at": "soon", "source": "file"}, "applied_at"),
        ({"version": 2, "applied_at": 1.0, "source": 7}, "source"),
    ],
)
async def test_a_members_weights_of_the_wrong_shape_are_refused_by_field(
    status: dict[str, object], field_name: str
) -> None:
    client = cast(PeerClient, AnswerOnce({"r1": status}))
    with pytest.raises(ValueError, match=field_name):
        await ask_weights(client, Peer("gpu-1", "127.0.0.1", 9), ["r1"])


async def test_a_members_weights_are_applied_weights() -> None:
    status = {"version": 2, "applied_at": 4.0, "source": "broadcast", "bytes": 9}
    client = cast(PeerClient, AnswerOnce({"r1": status, "r2": None}))
    answer = await ask_weights(client, Peer("gpu-1", "127.0.0.1", 9), [])
    assert answer == {"r1": {"version": 2, "applied_at": 4.0, "source": "broadcast"}, "r2": None}
