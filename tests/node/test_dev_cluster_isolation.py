"""Two `shoal dev-cluster` runs in two directories at once, on 127.0.0.1 with mDNS on: each has
its own cluster id (from its data dir), elects its own coordinator and runs a gang job, and
neither lists the other's nodes, though both name their nodes dev-1, dev-2, dev-3."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from node.cli.devcluster import dev_cluster_name
from tests.node.test_dev_cluster import ROOT, _free_base_port, _get, _until

NODES = 3
pytestmark = pytest.mark.timeout(420)


def _env() -> dict[str, str]:
    return {**os.environ, "SHOAL_CONFIG": "", "COLUMNS": "200"}


@contextlib.contextmanager
def _dev_cluster(data_dir: Path, base: int) -> Iterator[subprocess.Popen[str]]:
    """A running dev cluster; stopped on exit, its nodes killed if it does not stop them."""
    process = subprocess.Popen(
        [sys.executable, "-m", "node", "dev-cluster", "--nodes", str(NODES),
         "--base-port", str(base), "--data-dir", str(data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
    )  # fmt: skip
    pids: list[int] = []
    try:
        _until(lambda: (data_dir / "dev-cluster.json").exists(), 60, f"{data_dir} state file")
        state = json.loads((data_dir / "dev-cluster.json").read_text())
        pids = [node["pid"] for node in state["nodes"]]
        yield process
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _members(port: int) -> list[tuple[str, int, str]]:
    return [(m["node_id"], m["port"], m["state"]) for m in _get(port, "/v1/peers")["members"]]


def _sees_only(ports: list[int]) -> bool:
    """Every node of `ports` lists exactly dev-1... on those ports, alive."""
    expected = [(f"dev-{i + 1}", port, "alive") for i, port in enumerate(ports)]
    return all(sorted(_members(port)) == expected for port in ports)


def _agreed_coordinator(ports: list[int]) -> bool:
    statuses = [_get(port, "/v1/status") for port in ports]
    views = {(s["coordinator"], s["term"]) for s in statuses}
    return len(views) == 1 and next(iter(views))[0] is not None


def _gang_job(base: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "import os; print('rank', os.environ.get('RANK'))"]
    return subprocess.run(
        [sys.executable, "-m", "node", "jobs", "run", "--node", f"http://127.0.0.1:{base}",
         "--nodes", str(NODES), "--wait", "--", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=180, env=_env(), check=False,
    )  # fmt: skip


def test_two_dev_clusters_in_two_directories_never_see_each_other(tmp_path: Path) -> None:
    base_a = _free_base_port(NODES)
    base_b = _free_base_port(NODES)
    while abs(base_b - base_a) < NODES:
        base_b = _free_base_port(NODES)
    dir_a, dir_b = tmp_path / "a" / ".shoal", tmp_path / "b" / ".shoal"
    assert dev_cluster_name(dir_a) != dev_cluster_name(dir_b)
    ports = {"a": list(range(base_a, base_a + NODES)), "b": list(range(base_b, base_b + NODES))}
    with _dev_cluster(dir_a, base_a), _dev_cluster(dir_b, base_b):
        every = ports["a"] + ports["b"]
        _until(lambda: all(_get(p, "/v1/health") for p in every), 120, "6 dev nodes")
        for name, directory in (("a", dir_a), ("b", dir_b)):
            own = ports[name]
            assert {_get(p, "/v1/status")["cluster"] for p in own} == {dev_cluster_name(directory)}
            _until(partial(_sees_only, own), 120, f"cluster {name}: each node sees its own nodes")
            _until(partial(_agreed_coordinator, own), 120, f"cluster {name}: one coordinator")
        for name, base in (("a", base_a), ("b", base_b)):
            result = _gang_job(base)
            assert result.returncode == 0, f"cluster {name}: {result.stdout}\n{result.stderr}"
            assert result.stderr.count(" succeeded (exit code 0)") == NODES, result.stderr
        for name, other in (("a", "b"), ("b", "a")):
            for port in ports[name]:
                seen = {p for _, p, _ in _members(port)}
                assert seen == set(ports[name]), f"{port} lists {seen}; {other} is {ports[other]}"
            assert _agreed_coordinator(ports[name])
