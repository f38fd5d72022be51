"""The reading of keyring answers: a member's malformed keyring answer is that member's failure,
named by its field, and the CLI refuses a malformed change answer naming the field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from net import MockTransport, PeerClient, PeerRequest, PeerResponse
from node.cli import app, common
from node.errors import KeyringRefused
from node.keyring.routes import KeyringRoutes
from node.keyring.wire import LOCAL_PATH, LocalAnswer

KID = "0123456789abcdef"


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


@pytest.mark.parametrize(
    ("answer", "printed"),
    [
        (
            {"op": "use", "key_id": KID, "coordinator": "a", "acked": ["a", "b"], "failed": {}},
            f"use {KID}: acknowledged by 2 member(s) (a, b)\n",
        ),
        ({"op": "use", "key_id": KID, "coordinator": "a", "acked": "a", "failed": {}}, None),
    ],
)
def test_the_cli_reads_a_change_answer_and_refuses_a_malformed_one_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, answer: dict[str, object], printed: str | None
) -> None:
    def daemon(request: PeerRequest) -> PeerResponse:
        return PeerResponse.of_json(answer)

    monkeypatch.setattr(
        common, "peer_client", lambda *args: PeerClient(transport=MockTransport(daemon))
    )
    result = CliRunner().invoke(app, ["keyring", "use", KID, "--node", "http://127.0.0.1:1"])
    if printed is not None:
        assert (result.exit_code, result.output) == (0, printed)
    else:
        assert result.exit_code == 1
        assert "an answer that cannot be read: acked:" in result.output
