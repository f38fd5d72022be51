"""The cluster watches its training (issue 32's proof): three daemons as separate processes on
127.0.0.1, `training_nproc: 2`, gloo, a training command that uses `shoal.training_session()`
from a directory holding the six decoy modules.

- GET /v1/training on any node lists all 6 ranks advancing, and `shoal training --json` agrees;
  one node's ranks made 3x slower in compute are flagged, they and only they, within 30 s;
- SIGSTOP of one worker: a restart with reason `hang` within the hang timeout + 5 s, the stopped
  worker ended, the group advancing again in a new generation.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import LoopbackCluster
from tests.cluster.fixtures import LoopbackClusterFactory
from tests.cluster.process import ClusterProcess
from tests.cluster.waiting import wait_until
from tests.shoal.test_import_safety import write_decoys

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("training_cluster_worker.py")
HANG_S = 5.0
WINDOW = 10
TIMEOUTS = {
    "heartbeat_interval_s": 0.1,
    "lease_s": 0.8,
    "election_min_s": 0.8,
    "election_max_s": 1.6,
    "probe_interval_s": 0.3,
    "probe_timeout_s": 0.15,
    "indirect_probe_timeout_s": 0.3,
    "suspicion_s": 0.6,
    "collective_s": 40.0,
    "quorum_s": 60.0,
}


def get(url: str, path: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url + path, timeout=timeout_s) as answer:
        return json.loads(answer.read())


class TrainingCluster:
    """Three shoal daemons whose training command is the worker script run from `script_dir`;
    each node's TRAIN_SLOW is `slow.get(host, 1)`."""

    def __init__(
        self,
        cluster: LoopbackCluster,
        base: Path,
        slow: dict[str, float],
        hang_s: float = HANG_S,
        *,
        command: list[str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        self.out = base / "workers.jsonl"
        script_dir = base / "repo"
        script_dir.mkdir()
        write_decoys(script_dir)
        script = script_dir / "train.py"
        shutil.copy(WORKER, script)
        names = [host.name for host in cluster.hosts]
        seeds = [host.endpoint for host in cluster.hosts]
        self.daemons: list[ClusterProcess] = []
        for host in cluster.hosts:
            settings = {
                "node_id": host.name,
                "data_dir": str(host.data_dir),
                "bind": host.address,
                "port": host.port,
                "mdns": False,
                "cluster_name": f"train{os.getpid()}",
                "voters": names,
                "seeds": [seed for seed in seeds if seed != host.endpoint],
                "role": "training",
                "backend": "gloo",
                "gpus": "none",
                "training_nproc": 2,
                "training_command": command or [sys.executable, str(script)],
                "training_env": {
                    "WORKER_OUT": str(self.out),
                    "TRAIN_SLOW": str(slow.get(host.name, 1)),
                    "TORCH_CPP_LOG_LEVEL": "ERROR",
                    "PYTHONPATH": "",
                },
                "training_hang_s": hang_s,
                "straggler_window": WINDOW,
                "timeouts": TIMEOUTS,
                **(extra or {}),
            }
            config = host.data_dir / "shoal.yaml"
            config.write_text(yaml.safe_dump(settings))
            daemon = host.spawn(
                [sys.executable, "-m", "node.cli", "serve"],
                env={"SHOAL_CONFIG": str(config), "PYTHONPATH": str(ROOT)},
                cwd=ROOT,
                name="shoal",
            )
            self.daemons.append(daemon)
        self.urls = {host.name: f"http://{host.endpoint}" for host in cluster.hosts}

    def workers(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def first_steps(self, generation: int, event: str = "step", at: str = "at") -> dict[int, float]:
        """When each rank of `generation` finished its first step (unix seconds), by rank (or
        another `event`'s time `at`: start's exec_at and at)."""
        return {
            line["rank"]: line[at]
            for line in self.workers()
            if line["event"] == event and line["generation"] == generation
        }

    def view(self, node: str = "h1") -> dict[str, Any]:
        document: dict[str, Any] = get(self.urls[node], "/v1/training")
        return document

    def advancing(self, node: str, ranks: int = 6) -> dict[str, Any] | None:
        """The document once `ranks` ranks of one generation advance (seen twice), else None."""
        first = self.view(node)
        if len(first["ranks"]) != ranks or first["hung"]:
            return None
        time.sleep(0.5)
        second = self.view(node)
        before = {rank["rank"]: rank["step"] for rank in first["ranks"]}
        moved = all(rank["step"] > before.get(rank["rank"], 1 << 62) for rank in second["ranks"])
        same = second["generation"] == first["generation"] and len(second["ranks"]) == ranks
        return second if moved and same else None

    def close(self) -> None:
        """Stop the daemons gracefully (each stops its workers), then any worker left over."""
        for daemon in self.daemons:
            daemon.send_signal(signal.SIGCONT)
            daemon.send_signal(signal.SIGTERM)
        for daemon in self.daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(20.0)
        for worker in self.workers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker["pid"], signal.SIGKILL)


@pytest.fixture
def training_cluster(loopback_cluster: LoopbackClusterFactory, tmp_path: Path) -> Iterator[Any]:
    made: list[TrainingCluster] = []

    def make(slow: dict[str, float] | None = None) -> TrainingCluster:
        cluster = TrainingCluster(loopback_cluster(3), tmp_path, slow or {})
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def ask(cluster: TrainingCluster, node: str) -> dict[str, Any] | None:
    try:
        return cluster.advancing(node)
    except OSError:
        return None


@pytest.mark.timeout(300)
def test_every_node_sees_six_ranks_advancing_and_the_slow_nodes_ranks_straggle(
    training_cluster: Any,
) -> None:
    cluster: TrainingCluster = training_cluster({"h2": 3.0})
    view = wait_until(lambda: ask(cluster, "h0"), 180, 1.0, message="6 ranks advancing on h0")
    all_advancing_at = time.monotonic()
    assert sorted(rank["rank"] for rank in view["ranks"]) == list(range(6))
    by_node: dict[str, list[int]] = {}
    for rank in view["ranks"]:
        by_node.setdefault(rank["node"], []).append(rank["local_rank"])
    assert {node: sorted(locals_) for node, locals_ in by_node.items()} == {
        "h0": [0, 1],
        "h1": [0, 1],
        "h2": [0, 1],
    }
    for node in ("h1", "h2"):
        assert wait_until(lambda node=node: ask(cluster, node), 30, 0.5, message=node)
    printed = subprocess.run(
        [sys.executable, "-m", "node.cli", "training", "--json", "--node", cluster.urls["h2"]],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "SHOAL_CONFIG": ""},
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    document = json.loads(printed.stdout)
    assert document["generation"] == view["generation"]
    assert {(r["rank"], r["node"], r["local_rank"]) for r in document["ranks"]} == {
        (r["rank"], r["node"], r["local_rank"]) for r in view["ranks"]
    }
    assert all(
        mine["step"] >= seen["step"]
        for mine, seen in zip(document["ranks"], view["ranks"], strict=True)
    )

    def flagged() -> set[tuple[str, int]] | None:
        ranks = cluster.view("h0")["ranks"]
        found = {(r["node"], r["local_rank"]) for r in ranks if r["straggler"]}
        return found or None

    slow = wait_until(flagged, 30, 0.5, message="the slow node's ranks flagged")
    assert time.monotonic() - all_advancing_at <= 30
    assert slow == {("h2", 0), ("h2", 1)}, "they and only they"
    events = cluster.view("h1")["stragglers"]
    assert {(event["node"], event["action"]) for event in events} == {("h2", "report")}
    coordinator = cluster.view("h1")["coordinator"]
    metrics = urllib.request.urlopen(cluster.urls[coordinator] + "/metrics", timeout=10).read()
    assert b'shoal_training_straggler{node="h2"' in metrics
    assert b"shoal_training_stragglers 2.0" in metrics


@pytest.mark.timeout(300)
def test_a_stopped_worker_hangs_the_group_which_restarts_in_a_new_generation(
    training_cluster: Any,
) -> None:
    cluster: TrainingCluster = training_cluster()
    view = wait_until(lambda: ask(cluster, "h1"), 180, 1.0, message="6 ranks advancing")
    generation = view["generation"]
    timeout_s = max(HANG_S, view["hang_timeout_s"])
    victim = next(rank for rank in view["ranks"] if rank["node"] == "h2")
    os.kill(victim["pid"], signal.SIGSTOP)
    stopped_at = time.time()

    def hang_restart() -> dict[str, Any] | None:
        restarts = cluster.view("h0")["restarts"]
        return next((r for r in restarts if r["reason"] == "hang"), None)

    restart = wait_until(hang_restart, timeout_s + 30, 0.5, message="a restart for the hang")
    assert restart["generation"] > generation
    assert restart["at"] - stopped_at <= timeout_s + 5, (restart, timeout_s)
    assert "no rank advanced" in restart["detail"]

    def ended() -> bool:
        try:
            os.kill(victim["pid"], 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(ended, 20, 0.2, message=f"the stopped worker {victim['pid']} ended")
    again = wait_until(lambda: ask(cluster, "h0"), 180, 1.0, message="advancing again")
    assert again["generation"] >= restart["generation"]
    assert victim["pid"] not in {rank["pid"] for rank in again["ranks"]}
    # the coordinator of the restart audited it (an election since may have moved the role)
    audits = [get(url, "/v1/audit?kind=training")["entries"] for url in cluster.urls.values()]
    hangs = [e for entries in audits for e in entries if e["detail"]["reason"] == "hang"]
    assert any(e["detail"]["generation"] == restart["generation"] for e in hangs), audits
