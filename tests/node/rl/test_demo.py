"""`shoal rl demo` end to end: a 2-node local cluster, JSON lines per step, and every node
ending with the trainer's weights."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli.rl import start_local_cluster

pytest.importorskip("torch")

STEPS = 3


def free_base_port() -> int:
    """A base port with the next one free too (the demo's nodes take consecutive ports)."""
    for _ in range(50):
        base = random.randint(20_000, 28_000)
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", base))
                second.bind(("127.0.0.1", base + 1))
        except OSError:
            continue
        return base
    raise AssertionError("no two consecutive free ports")


@pytest.mark.timeout(300)
def test_the_demo_trains_and_every_node_ends_with_the_same_weights() -> None:
    command = [sys.executable, "-m", "node", "rl", "demo", "--nodes", "2", "--steps", str(STEPS)]
    command += ["--batch-size", "16", "--json", "--base-port", str(free_base_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    steps = [line for line in lines if "reward_mean" in line]
    assert [line["step"] for line in steps] == list(range(1, STEPS + 1))
    for line in steps:
        assert line.keys() >= {"version", "samples", "dropped_stale", "max_lag_seen"}
        assert line["samples"] == 16
        assert line["max_lag_seen"] <= 2
    final = lines[-1]
    assert final["final_version"] == STEPS
    digests = final["weights_digest"]  # sha256 on CPUs, shoal-pws64-v1 on GPUs
    assert sorted(digests) == ["rl-1", "rl-2"]
    assert digests["rl-1"] is not None
    assert digests["rl-1"]["value"]
    assert digests["rl-1"] == digests["rl-2"]
    assert sorted(final["weights_sha256"]) == ["rl-1", "rl-2"]


@pytest.mark.timeout(300)
def test_the_demo_runs_on_existing_nodes_given_with_node(tmp_path: Path) -> None:
    urls, daemons = start_local_cluster(tmp_path, 2, free_base_port())
    try:
        # the trainer is found by its weights rank, whatever the order of --node
        command = [sys.executable, "-m", "node", "rl", "demo", "--steps", str(STEPS), "--json"]
        command += ["--batch-size", "16", "--node", urls["rl-2"], "--node", urls["rl-1"] + "/"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=280, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        steps = [line for line in lines if "reward_mean" in line]
        assert [line["step"] for line in steps] == list(range(1, STEPS + 1))
        final = lines[-1]
        assert final["final_version"] == STEPS
        digests = final["weights_digest"]  # sha256 on CPUs, shoal-pws64-v1 on GPUs
        assert sorted(digests) == ["rl-1", "rl-2"]
        assert digests["rl-1"] is not None
        assert digests["rl-1"]["value"]
        assert digests["rl-1"] == digests["rl-2"]
        assert sorted(final["weights_sha256"]) == ["rl-1", "rl-2"]
        assert all(daemon.poll() is None for daemon in daemons)  # used, not started or stopped
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            daemon.wait(30)


def test_nodes_outside_the_weights_group_are_named() -> None:
    base = free_base_port()
    command = [sys.executable, "-m", "node", "rl", "demo", "--json", "--wait-s", "1"]
    command += ["--node", f"http://127.0.0.1:{base}", "--node", f"http://127.0.0.1:{base + 1}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert f"http://127.0.0.1:{base}" in done.stderr
    assert "weights group" in done.stderr
