"""`shoal dev-cluster` and `shoal rl demo` give each node a disjoint share of the host's GPUs
(node i of N: GPUs i, i + N, ...); the GPUs come from the SHOAL_TEST_FAKE_GPUS seam."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from config import load_settings
from health import ENV_FAKE_GPUS
from node.cli.devcluster import dev_gpus
from node.cli.rl import demo_node_config
from tests.node.test_dev_cluster import ROOT, _free_base_port, _get, _until


def test_dev_cluster_nodes_get_their_share_or_nothing_without_gpus() -> None:
    assert [dev_gpus(i, 3, 4) for i in range(3)] == ["0,3", "1", "2"]
    assert [dev_gpus(i, 2, 1) for i in range(2)] == ["0", "none"]
    assert dev_gpus(0, 3, 0) is None


def test_rl_demo_nodes_are_configured_with_their_share() -> None:
    trainer = yaml.safe_load(demo_node_config(0, 3, 4))
    assert trainer == {
        "role": "training",
        "backend": "gloo",
        "max_training": 1,
        "training_nproc": 1,
        "gpus": [0, 3],
    }
    assert yaml.safe_load(demo_node_config(2, 3, 2))["gpus"] == "none"
    assert "gpus" not in yaml.safe_load(demo_node_config(1, 3, 0))
    for index in range(3):
        load_settings(env={}, flags=yaml.safe_load(demo_node_config(index, 3, 4)))


def test_dev_cluster_nodes_advertise_disjoint_gpus(tmp_path: Path) -> None:
    base = _free_base_port(2)
    data_dir = tmp_path / "dev"
    env = {**os.environ, "SHOAL_CONFIG": "", ENV_FAKE_GPUS: "GPU-d0,GPU-d1,GPU-d2"}
    cluster = subprocess.Popen(
        [sys.executable, "-m", "node", "dev-cluster", "--nodes", "2", "--base-port", str(base),
         "--data-dir", str(data_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )  # fmt: skip
    try:

        def uuids() -> dict[str, object]:
            members = _get(base, "/v1/peers")["members"]
            return {m["node_id"]: m["meta"].get("gpu_uuids") for m in members}

        expected = {"dev-1": "GPU-d0,GPU-d2", "dev-2": "GPU-d1"}
        _until(lambda: uuids() == expected, 60, "both dev nodes to advertise their GPUs")
        state = json.loads((data_dir / "dev-cluster.json").read_text())
        assert {node["name"]: node["gpus"] for node in state["nodes"]} == {
            "dev-1": "0,2",
            "dev-2": "1",
        }
    finally:
        cluster.send_signal(signal.SIGINT)
        output, _ = cluster.communicate(timeout=60)
    assert "GPUs 0,2" in output, output
