from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from node.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "examples" / "hosts.yaml"
runner = CliRunner()


def test_hosts_check_prints_table_of_hosts() -> None:
    result = runner.invoke(app, ["hosts", "check", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    for name in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
        assert name in result.output
    assert "3 voters: gpu-a, gpu-b, gpu-c" in result.output


def test_hosts_check_bad_inventory_exits_2_with_each_error(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts:\n  gpu-a:\n    ssh_host: h\n    ssh_port: abc\n    gpu_vram: 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "node", "hosts", "check", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"shoal: error: {bad}:4: hosts.gpu-a.ssh_port: must be an integer 1-65535, got 'abc'",
        f"shoal: error: {bad}:5: hosts.gpu-a.gpu_vram: unknown key; did you mean 'gpu_vram_gb'?",
    ]


def test_hosts_list_json_and_role_filter() -> None:
    result = runner.invoke(app, ["hosts", "list", "--inventory", str(EXAMPLE), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [h["node_id"] for h in data["hosts"]] == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    result = runner.invoke(
        app, ["hosts", "list", "--inventory", str(EXAMPLE), "--json", "--role", "training"]
    )
    assert [h["node_id"] for h in json.loads(result.output)["hosts"]] == ["gpu-a", "gpu-b"]


def test_hosts_list_uses_the_environment_inventory() -> None:
    result = runner.invoke(
        app, ["hosts", "list", "--json"], env={"SHOAL_CLUSTER_CONFIG": str(EXAMPLE)}
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["cluster"] == "lab"


def test_hosts_list_without_inventory_is_a_usage_error() -> None:
    result = runner.invoke(app, ["hosts", "list"], env={"SHOAL_CLUSTER_CONFIG": ""})
    assert result.exit_code == 2
    assert "no inventory" in result.output


def test_config_show_json_reports_sources(tmp_path: Path) -> None:
    config = tmp_path / "shoal.yaml"
    config.write_text("cluster_name: lab\n")
    result = runner.invoke(
        app,
        ["config", "show", "--json", "--config", str(config)],
        env={"SHOAL_P2P_PORT": "9001"},
    )
    assert result.exit_code == 0, result.output
    settings = json.loads(result.output)["settings"]
    assert settings["port"] == {"value": 9001, "source": "env:SHOAL_P2P_PORT"}
    assert settings["cluster_name"] == {"value": "lab", "source": f"file:{config}:1"}
    assert settings["timeouts.sync_s"]["source"] == "default"


def test_config_show_bad_env_exits_2() -> None:
    result = runner.invoke(app, ["config", "show"], env={"SHOAL_CIRCUIT_THRESHOLD": "zero"})
    assert result.exit_code == 2
    assert "SHOAL_CIRCUIT_THRESHOLD" in result.output


def test_version_and_help() -> None:
    assert runner.invoke(app, ["version"]).output.startswith("shoal ")
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "hosts" in result.output
