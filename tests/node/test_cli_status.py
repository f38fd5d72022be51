"""`shoal status` as a person reads it: no Python `None` leaks into the table."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from node.cli import app
from node.daemon import NodeDaemon
from tests.node.daemons import test_settings


async def test_status_table_says_dash_when_nothing_is_pending(tmp_path: Path) -> None:
    runner = CliRunner()
    async with NodeDaemon(test_settings(tmp_path, "calm")) as daemon:
        node = f"http://127.0.0.1:{daemon.port}"
        result = await asyncio.to_thread(
            runner.invoke, app, ["status", "--node", node], env={"COLUMNS": "200"}
        )
    assert result.exit_code == 0, result.output
    assert "0 pending, oldest -" in result.output
    assert "None s" not in result.output
