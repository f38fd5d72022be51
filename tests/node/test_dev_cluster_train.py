"""`shoal dev-cluster --train`: every node takes the training role and runs examples/train.py
(gloo, one process and one warm spare), so the dev cluster trains: /v1/training shows the
group's ranks advancing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from config import load_settings
from node.cli.devcluster import train_settings, write_train_config
from tests.node.test_dev_cluster import ROOT, _free_base_port, _get, _until

SCRIPT = ROOT / "examples" / "train.py"


def test_train_gives_every_node_the_training_role_and_the_example_as_its_command(
    tmp_path: Path,
) -> None:
    settings = train_settings(SCRIPT)
    assert settings["role"] == "training"
    assert settings["backend"] == "gloo"
    command = settings["training_command"]
    assert isinstance(command, list)
    assert command[:2] == [sys.executable, str(SCRIPT)]
    assert SCRIPT.is_file()
    path = write_train_config(tmp_path, "dev-1", SCRIPT)
    loaded = load_settings(path, env={}).settings
    assert loaded.training_command == tuple(command)
    assert (loaded.role, loaded.backend, loaded.training_spares) == ("training", "gloo", 1)


@pytest.mark.timeout(240)
def test_a_dev_cluster_with_train_trains(tmp_path: Path) -> None:
    base = _free_base_port(2)
    data_dir = tmp_path / "dev"
    env = {**os.environ, "SHOAL_CONFIG": ""}
    cluster = subprocess.Popen(
        [sys.executable, "-m", "node", "dev-cluster", "--nodes", "2", "--base-port", str(base),
         "--data-dir", str(data_dir), "--train"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )  # fmt: skip
    seen: dict[str, Any] = {}
    try:

        def advancing() -> bool:
            view = _get(base, "/v1/training")
            seen.update(view)
            ranks = view["ranks"]
            return view["world_size"] == 2 and len(ranks) == 2 and min(r["step"] for r in ranks) > 5

        _until(advancing, 200, f"both dev nodes to train (last /v1/training: {seen})")
        assert {rank["node"] for rank in seen["ranks"]} == {"dev-1", "dev-2"}
    finally:
        cluster.send_signal(signal.SIGINT)
        output, _ = cluster.communicate(timeout=60)
    assert "every node trains" in output, output
