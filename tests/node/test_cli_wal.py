from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from node.cli import app
from node.cli.wal import parse_duration_s
from wal import WriteAheadLog

runner = CliRunner()


def _env(tmp_path: Path) -> dict[str, str]:
    return {"SHOAL_DATA_DIR": str(tmp_path), "SHOAL_CONFIG": ""}


def _fill(path: Path) -> None:
    async def fill() -> None:
        async with WriteAheadLog(path) as wal:
            first = await wal.append("sync_started", {"peer": "gpu-b"}, key="s-1")
            await wal.append("game_recorded", {"game_id": "g-1"}, key="g-1")
            await wal.commit(first)

    path.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(fill())


def test_status_pending_and_cleanup(tmp_path: Path) -> None:
    _fill(tmp_path / "wal" / "wal.db")
    result = runner.invoke(app, ["wal", "status", "--json"], env=_env(tmp_path))
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["pending"] == 1
    assert stats["committed"] == 1
    result = runner.invoke(app, ["wal", "pending", "--json"], env=_env(tmp_path))
    pending = json.loads(result.output)["pending"]
    assert [(e["entry_type"], e["key"]) for e in pending] == [("game_recorded", "g-1")]
    result = runner.invoke(
        app, ["wal", "pending", "--type", "sync_started", "--json"], env=_env(tmp_path)
    )
    assert json.loads(result.output)["pending"] == []
    result = runner.invoke(
        app, ["wal", "cleanup", "--older-than", "0s", "--json"], env=_env(tmp_path)
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["removed"] == 1
    result = runner.invoke(app, ["wal", "status"], env=_env(tmp_path))
    assert result.exit_code == 0
    assert "pending" in result.output


def test_bad_duration_is_a_usage_error(tmp_path: Path) -> None:
    _fill(tmp_path / "wal" / "wal.db")
    result = runner.invoke(app, ["wal", "cleanup", "--older-than", "soon"], env=_env(tmp_path))
    assert result.exit_code == 2
    assert "not a duration" in result.output


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("15m", 900), ("24h", 86400), ("1.5d", 129600)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


def test_missing_wal_is_reported(tmp_path: Path) -> None:
    result = runner.invoke(app, ["wal", "status"], env=_env(tmp_path))
    assert result.exit_code == 1
    assert "no WAL here yet" in result.output


def test_corrupt_wal_stops_with_the_file_name_and_moves_aside_only_on_request(
    tmp_path: Path,
) -> None:
    path = tmp_path / "wal" / "wal.db"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database" * 100)
    result = runner.invoke(app, ["wal", "status"], env=_env(tmp_path))
    assert result.exit_code == 2
    assert str(path) in result.output
    assert path.read_bytes().startswith(b"this is not")  # never silently re-created
    result = runner.invoke(app, ["wal", "open", "--move-aside"], env=_env(tmp_path))
    assert result.exit_code == 0, result.output
    assert "moved the damaged WAL" in result.output
    moved = [p for p in path.parent.iterdir() if ".corrupt-" in p.name]
    assert len(moved) == 1
    assert moved[0].read_bytes().startswith(b"this is not")
    assert runner.invoke(app, ["wal", "status"], env=_env(tmp_path)).exit_code == 0


@pytest.mark.parametrize("command", ["status", "pending", "cleanup", "open"])
def test_data_dir_flag_picks_the_node_whose_wal_is_read(tmp_path: Path, command: str) -> None:
    node_dir = tmp_path / "node-b"
    _fill(node_dir / "wal" / "wal.db")
    env = {"SHOAL_DATA_DIR": str(tmp_path / "elsewhere"), "SHOAL_CONFIG": ""}
    extra = ["--json"] if command != "open" else []
    result = runner.invoke(app, ["wal", command, "--data-dir", str(node_dir), *extra], env=env)
    assert result.exit_code == 0, result.output
    assert str(node_dir / "wal" / "wal.db") in result.output.replace("\n", "")
