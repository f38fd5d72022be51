"""`shoal node` exit codes without a cluster: 2 for bad input, 1 for an unreachable node (the
cluster cases are in tests/node/test_drain_cluster.py)."""

from __future__ import annotations

import socket

from typer.testing import CliRunner

from node.cli import app


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
