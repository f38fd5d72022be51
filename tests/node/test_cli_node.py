"""`shoal node` exit codes without a cluster: 2 for bad input, 1 for an unreachable node (the
cluster cases are in tests/node/test_drain_cluster.py)."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from net import MockTransport, PeerClient, PeerRequest, PeerResponse
from node.cli import app, common


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_bad_input_exits_2_and_an_unreachable_node_exits_1() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    runner = CliRunner()
    for args in (
        ["node", "drain", "bad id!", "--node", url],
        ["node", "drain", "gpu-b", "--kill-after", "-1", "--node", url],
        ["node", "drain", "gpu-b", "--wait", "--timeout", "0", "--node", url],
        ["node", "undrain", "-x", "--node", url],
        ["node", "leave", "a/b", "--node", url],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
    for command in ("drain", "undrain", "leave"):
        result = runner.invoke(app, ["node", command, "gpu-b", "--node", url, "--json"])
        assert result.exit_code == 1, (command, result.output)
        assert url in result.output


def _answers(request: PeerRequest) -> PeerResponse:
    """A daemon that undrains gpu-b and lets it leave, does not know gpu-c, and fails on
    gpu-d."""
    node = request.path_qs.split("/")[3]
    if node == "gpu-c":
        return PeerResponse.of_json({"error": "not_found", "reason": "no node gpu-c"}, 404)
    if node == "gpu-d":
        return PeerResponse.of_json({"error": "internal_error", "reason": "boom"}, 500)
    plan = {"plan": [4, 2], "coordinator": "gpu-a", "applied": True, "kill_after_s": None}
    return PeerResponse.of_json({"node": node, "draining": False, **plan})


def test_an_answer_is_printed_and_a_refusal_exits_with_its_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[PeerRequest] = []

    def answer(request: PeerRequest) -> PeerResponse:
        calls.append(request)
        return _answers(request)

    # a client per command, as the real one (closed when the request is done)
    monkeypatch.setattr(
        common, "peer_client", lambda *args: PeerClient(transport=MockTransport(answer))
    )
    runner = CliRunner()
    url = "http://127.0.0.1:1"
    result = runner.invoke(app, ["node", "undrain", "gpu-b", "--node", url])
    assert result.exit_code == 0, result.output
    assert result.output == "node gpu-b is not draining (plan 4.2, coordinator gpu-a)\n"
    result = runner.invoke(app, ["node", "leave", "gpu-b", "--node", url])
    assert (result.exit_code, result.output) == (0, "node gpu-b leaves the cluster\n")
    result = runner.invoke(app, ["node", "leave", "gpu-b", "--node", url, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["coordinator"] == "gpu-a"
    result = runner.invoke(app, ["node", "undrain", "gpu-c", "--node", url])
    assert result.exit_code == 2, "an unknown node is bad input"
    assert "HTTP 404: no node gpu-c" in result.output
    result = runner.invoke(app, ["node", "leave", "gpu-d", "--node", url])
    assert result.exit_code == 1, result.output
    assert [(r.method, r.path_qs) for r in calls][:2] == [
        ("POST", "/v1/nodes/gpu-b/undrain"),
        ("POST", "/v1/nodes/gpu-b/leave"),
    ]
