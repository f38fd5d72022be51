"""Checkpoints of a real training group: three `shoal serve` daemons on loopback (every one a
voter, the cluster secret set), each running `train_worker.py` as 2 gloo workers
(`training_nproc: 2`) that save every 20 steps.

- `committed.step` advances, and every node's files are held by the two others;
- one node's SIGKILL (its daemon and its workers): the other 4 ranks restart in a world of 4 and
  restore the committed step (the state they load is that step's, never 0);
- the killed node's data dir wiped and the node restarted: its ranks restore the committed step
  from peers (`last_restore.from` is `peers`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shoal._daemon import DaemonClient
from shoal.errors import ShoalError
from tests.cluster import ClusterProcess, Host, LoopbackCluster, LoopbackClusterFactory

pytestmark = pytest.mark.timeout(1200)

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("train_worker.py")
NPROC = 2
T = TypeVar("T")
TIMEOUTS = {
    "heartbeat_interval_s": 0.1,
    "lease_s": 0.8,
    "election_min_s": 0.8,
    "election_max_s": 1.6,
    "probe_interval_s": 0.2,
    "probe_timeout_s": 0.15,
    "indirect_probe_timeout_s": 0.3,
    "suspicion_s": 1.0,
}
"""Shrunk election and membership timing: a killed node leaves the plan in a few seconds."""


def wait_for(
    probe: Callable[[], T | None], timeout_s: float, what: str, guard: Callable[[], None]
) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        guard()
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout_s:g} s")


class Training:
    """The daemons of `cluster`, their workers' events, and the checkpoints they report."""

    def __init__(self, cluster: LoopbackCluster) -> None:
        self.cluster = cluster
        self.base = cluster.base_dir
        self.out = self.base / "workers.jsonl"
        self.secret = self.base / "secret"
        self.secret.write_text(secrets.token_hex(32) + "\n", encoding="utf-8")
        self.secret.chmod(0o600)
        self.names = [host.name for host in cluster.hosts]
        self.daemons: dict[str, ClusterProcess] = {}
        self.down: set[str] = set()
        seeds = [host.endpoint for host in cluster.hosts]
        for host in cluster.hosts:
            config = {
                "voters": self.names,
                "seeds": [s for s in seeds if s != host.endpoint],
                "mdns": False,
                "role": "training",
                "backend": "gloo",
                "gpus": "none",
                "training_nproc": NPROC,
                "training_command": [sys.executable, str(WORKER)],
                "training_env": {
                    "PYTHONPATH": str(ROOT),
                    "WORKER_OUT": str(self.out),
                    "WORKER_TIMEOUT_S": "20",
                    "WORKER_STEP_S": "0.1",
                    "TORCH_CPP_LOG_LEVEL": "ERROR",
                },
                "sync_interval_s": 0,
                "timeouts": TIMEOUTS,
            }
            self.config(host).write_text(json.dumps(config) + "\n", encoding="utf-8")

    def config(self, host: Host) -> Path:
        return self.base / f"{host.name}.yaml"

    def host(self, name: str) -> Host:
        return next(h for h in self.cluster.hosts if h.name == name)

    def start(self, name: str) -> None:
        host = self.host(name)
        env = {
            "SHOAL_CONFIG": str(self.config(host)),
            "SHOAL_NODE_ID": name,
            "SHOAL_BIND": host.address,
            "SHOAL_P2P_PORT": str(host.port),
            "SHOAL_DATA_DIR": str(host.data_dir),
            "SHOAL_SECRET_FILE": str(self.secret),
        }
        argv = [sys.executable, "-m", "node", "serve"]
        self.daemons[name] = host.spawn(argv, env=env, cwd=ROOT, name="shoal")
        self.down.discard(name)

    def guard(self) -> None:
        for name, proc in self.daemons.items():
            if name not in self.down and not proc.running():
                raise AssertionError(f"the daemon of {name} exited:\n{proc.log_tail(30)}")

    def client(self, name: str) -> DaemonClient:
        host = self.host(name)
        secret = self.secret.read_bytes().strip()
        return DaemonClient(f"http://{host.endpoint}", secret=secret, timeout_s=5)

    def checkpoints(self, name: str) -> dict[str, Any]:
        client = self.client(name)
        try:
            answer = client.request("GET", "/v1/checkpoints")
        except ShoalError:
            return {}
        finally:
            client.close()
        return answer if isinstance(answer, dict) else {}

    def events(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        lines = self.out.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def node_of(self, event: dict[str, Any]) -> str:
        port = str(event["daemon"]).rsplit(":", 1)[1]
        return next(h.name for h in self.cluster.hosts if str(h.port) == port)

    def worker_pids(self, name: str | None = None) -> set[int]:
        return {e["pid"] for e in self.events() if name is None or self.node_of(e) == name}

    def kill_node(self, name: str) -> None:
        """A host's crash: SIGKILL its daemon and its workers."""
        self.down.add(name)
        self.daemons[name].kill()
        for pid in self.worker_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def restored(self, world_size: int, after: float) -> list[dict[str, Any]]:
        """The restores of the newest generation of `world_size` ranks begun after `after`."""
        found = [
            e
            for e in self.events()
            if e["event"] == "restored" and e["world_size"] == world_size and e["t"] > after
        ]
        if not found:
            return []
        newest = max(e["generation"] for e in found)
        return [e for e in found if e["generation"] == newest]


@pytest.fixture
def training(loopback_cluster: LoopbackClusterFactory) -> Iterator[Training]:
    cluster = loopback_cluster(3)
    run = Training(cluster)
    try:
        yield run
    finally:
        for pid in run.worker_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def held_by_two_others(committed: dict[str, Any], names: list[str]) -> bool:
    holders = committed.get("holders") or {}
    return set(holders) == set(names) and all(
        len(set(nodes) - {owner}) >= 2 for owner, nodes in holders.items()
    )


def test_a_group_saves_commits_copies_and_restores_after_a_crash_and_a_wiped_host(
    training: Training,
) -> None:
    names = training.names
    for name in names:
        training.start(name)

    def committed_everywhere(after_step: int) -> Callable[[], dict[str, Any] | None]:
        """A kept committed step above `after_step` whose every node's files the two others
        hold (the newest may still be copying when the next one commits)."""

        def probe() -> dict[str, Any] | None:
            steps = training.checkpoints(names[0]).get("steps") or []
            held = [s for s in steps if s["step"] > after_step and held_by_two_others(s, names)]
            return dict(held[-1]) if held else None

        return probe

    first = wait_for(
        committed_everywhere(0), 600, "a committed step on all 3 nodes", training.guard
    )
    assert first["world_size"] == 6
    later = wait_for(
        committed_everywhere(first["step"]), 300, "committed.step advancing", training.guard
    )
    assert later["step"] > first["step"]

    victim = names[2]
    killed_at = time.time()
    training.kill_node(victim)
    survivors = [name for name in names if name != victim]
    four = wait_for(
        lambda: (found := training.restored(4, killed_at)) and len(found) == 4 and found,
        600,
        "4 ranks restored in a world of 4",
        training.guard,
    )
    step = four[0]["step"]
    assert step is not None, four
    assert step >= later["step"], four
    for event in four:
        assert training.node_of(event) in survivors
        assert (event["step"], event["w"], event["state_step"]) == (step, [step], step), event

    shutil.rmtree(training.host(victim).data_dir)
    training.host(victim).data_dir.mkdir()
    restarted_at = time.time()
    training.start(victim)
    six = wait_for(
        lambda: (found := training.restored(6, restarted_at)) and len(found) == 6 and found,
        600,
        "6 ranks restored after the wiped node came back",
        training.guard,
    )
    again = six[0]["step"]
    assert again is not None, six
    assert again >= step, six
    for event in six:
        assert (event["step"], event["w"], event["state_step"]) == (again, [again], again)
    assert sorted(training.node_of(e) for e in six) == sorted(names * NPROC)

    def wiped_restore() -> dict[str, Any] | None:
        nodes = training.checkpoints(names[0]).get("nodes") or {}
        last = (nodes.get(victim) or {}).get("last_restore")
        return last if last and last["step"] == again else None

    last = wait_for(wiped_restore, 120, f"{victim}'s restore recorded", training.guard)
    assert last["from"] == "peers", last
    assert last["fetched_bytes"] == last["bytes"] > 0, last

    def training_document() -> dict[str, Any] | None:
        client = training.client(names[0])
        try:
            document = client.request("GET", "/v1/training")
        except ShoalError:
            return None
        finally:
            client.close()
        if not isinstance(document, dict) or not document.get("committed"):
            return None
        part = (document.get("nodes") or {}).get(victim) or {}
        return document if (part.get("last_restore") or {}).get("step") == again else None

    document = wait_for(training_document, 120, "/v1/training's checkpoints", training.guard)
    committed = document["committed"]
    assert committed["step"] >= again, committed
    assert {"step", "at", "bytes", "holders"} <= set(committed), committed
    assert set(committed["holders"]) <= set(names), committed
    restore = document["nodes"][victim]["last_restore"]
    assert (restore["from"], restore["step"]) == ("peers", again), restore
    assert restore["bytes"] > 0
    assert restore["seconds"] >= 0
