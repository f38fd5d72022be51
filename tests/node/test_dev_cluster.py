"""`shoal dev-cluster` is a place to try failures: kill one node, the rest run on; restart it."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.cli.devcluster import dev_cluster_name

ROOT = Path(__file__).resolve().parents[2]


def _free_base_port(count: int) -> int:
    for _ in range(100):
        base = random.randint(20000, 40000)
        try:
            for port in range(base, base + count):
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    with socket.socket(socket.AF_INET, kind) as sock:
                        sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free port range")


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
        return json.loads(response.read())


def _until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if check():
                return time.monotonic() - started
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SHOAL_CONFIG": "", "COLUMNS": "200"},
    )


def _states(port: int) -> dict[str, str]:
    return {m["node_id"]: m["state"] for m in _get(port, "/v1/peers")["members"]}


def test_a_killed_node_is_reported_the_others_run_on_and_restart_brings_it_back(
    tmp_path: Path,
) -> None:
    base = _free_base_port(3)
    data_dir = tmp_path / "dev"
    cluster = subprocess.Popen(
        [sys.executable, "-m", "node", "dev-cluster", "--nodes", "3", "--base-port", str(base),
         "--data-dir", str(data_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "SHOAL_CONFIG": "", "COLUMNS": "200"},
    )  # fmt: skip
    pids: list[int] = []
    try:
        ports = [base, base + 1, base + 2]
        _until(lambda: all(_get(p, "/v1/health") for p in ports), 60, "3 dev nodes")
        assert _get(base, "/v1/status")["cluster"] == dev_cluster_name(data_dir)
        _until(lambda: set(_states(base).values()) == {"alive"} and len(_states(base)) == 3,
               60, "dev-1 to see 3 alive members")  # fmt: skip

        killed = _shoal("dev-cluster", "kill", "dev-2", "--data-dir", str(data_dir))
        assert killed.returncode == 0, killed.stdout + killed.stderr
        assert "sent SIGKILL to dev-2" in killed.stdout
        waited = _until(lambda: _states(base).get("dev-2") == "dead", 60, "dev-2 dead")
        print(f"dev-1 declared the killed dev-2 dead after {waited:.1f} s")
        assert cluster.poll() is None, "the dev cluster keeps running when a node dies"
        assert _get(base + 2, "/v1/health")

        restarted = _shoal("dev-cluster", "restart", "dev-2", "--data-dir", str(data_dir))
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        _until(lambda: _states(base).get("dev-2") == "alive", 60, "dev-2 alive again")
        state = json.loads((data_dir / "dev-cluster.json").read_text())
        pids = [node["pid"] for node in state["nodes"]]
        unknown = _shoal("dev-cluster", "kill", "dev-9", "--data-dir", str(data_dir))
        assert unknown.returncode == 2
        assert "no node 'dev-9'" in unknown.stdout + unknown.stderr
    finally:
        cluster.send_signal(signal.SIGINT)
        output, _ = cluster.communicate(timeout=60)
    assert "dev-2 (pid" in output, output
    assert "exited; the other nodes keep running" in output, output
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"node pid {pid} still runs after the dev cluster stopped")
    assert not (data_dir / "dev-cluster.json").exists()
