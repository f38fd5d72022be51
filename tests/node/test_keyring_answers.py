"""The coordinator's reading of a member's keyring answer: a malformed one is that member's
failure, named by its field, not a crash of the cluster-wide request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from node.errors import KeyringRefused
from node.keyring.routes import KeyringRoutes
from node.keyring.wire import LOCAL_PATH, LocalAnswer


class _Member:
    """A peer client whose member answers `answer`."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    async def call_json(self, *args: object, **kwargs: object) -> tuple[int, object]:
        return 200, self.answer


def _routes(answer: object) -> KeyringRoutes:
    routes = KeyringRoutes(SimpleNamespace(node_id="a"), None, None)
    routes._client = _Member(answer)
    return routes


async def test_a_members_keyring_answer_is_read_as_its_model() -> None:
    state = {"node": "b", "primary": "0" * 16, "keys": ["0" * 16], "file": "/k.json"}
    answer = await _routes(state)._call("b", "127.0.0.1:1", "GET", LOCAL_PATH, None)
    assert answer == LocalAnswer.model_validate(state)
    assert answer.to_json() == state


@pytest.mark.parametrize(
    ("state", "field"),
    [
        ({"node": "b", "primary": "0" * 16, "keys": "0" * 16}, "keys"),
        ({"node": "b", "keys": []}, "primary"),
    ],
)
async def test_a_malformed_keyring_answer_is_refused_naming_the_field(
    state: dict[str, object], field: str
) -> None:
    with pytest.raises(KeyringRefused, match=f"malformed answer: {field}"):
        await _routes(state)._call("b", "127.0.0.1:1", "GET", LOCAL_PATH, None)
