"""`shoal runs` against a loopback cluster: submit --json, status, list, logs, cancel."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from node.cli import app
from tests.node.runs.cluster import running
from tests.node.runs.test_runs_cluster import wait_done

PRINT = "print('hello from the run'); open('out.txt', 'w').write('ok')"


async def invoke(*args: str) -> tuple[int, str]:
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
    return result.exit_code, result.output


async def test_runs_cli_submits_shows_logs_and_refuses_bad_input(tmp_path: Path) -> None:
    async with running(tmp_path) as cluster:
        url = cluster.urls[0]
        code, out = await invoke(
            "runs", "submit", "--node", url, "--json", "--nodes", "2", "--name", "cli",
            "--results", "out.txt", "--max-duration", "10m", "--", sys.executable, "-c", PRINT,
        )  # fmt: skip
        assert code == 0, out
        record = json.loads(out)
        assert record["max_duration_s"] == 600.0
        assert record["results"] == ["out.txt"]
        done = await wait_done(cluster, record["run_id"], 60)
        assert done["state"] == "succeeded"
        code, out = await invoke("runs", "status", record["run_id"], "--node", url)
        assert code == 0
        assert "succeeded" in out
        code, out = await invoke("runs", "list", "--node", url, "--json")
        assert [r["run_id"] for r in json.loads(out)] == [record["run_id"]]
        code, out = await invoke("runs", "logs", record["run_id"], "--node", url)
        assert code == 0, out
        prefixed = [line for line in out.splitlines() if line.endswith("hello from the run")]
        assert sorted(line.split("]")[0] for line in prefixed) == sorted(
            f"[{u['node']}" for u in done["uploaded"]
        )
        code, out = await invoke("runs", "cancel", record["run_id"], "--node", url)
        assert code == 1
        assert "already ended" in out
        code, out = await invoke(
            "runs", "submit", "--node", url, "--max-duration", "soon", "--", "true"
        )
        assert code == 2
        assert "--max-duration" in out
