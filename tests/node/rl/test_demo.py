"""`shoal rl demo` end to end: a 2-node local cluster, JSON lines per step, and every node
ending with the trainer's weights."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys

import pytest

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
    shas = final["weights_sha256"]
    assert sorted(shas) == ["rl-1", "rl-2"]
    assert shas["rl-1"] is not None
    assert shas["rl-1"] == shas["rl-2"]
