"""Checkpoint costs, each beside its reference from the same run.

1. Save: how long `Checkpointer.save` holds the training loop for a state of --state-mib,
   blocking (the whole DCP write, fsync included) vs async (staging the copy into reused
   buffers; the write goes on in the background, its duration also given); and DCP's load of
   it from local disk. One process, no daemon.
2. Cluster (3 `shoal serve` processes on loopback, every one a voter; 6 ranks, 2 per node,
   --rank-mib each): commit latency (from the last rank's report to the step visible as
   committed, and the coordinator's own figure: last report in to the commit stored on a
   majority); replication (from the commit to every node's files held by 2 others, the
   bytes copied per second); restore of the step on one node with every file there (`local`)
   vs after its checkpoint directory was wiped (`peers`: fetched from the two holders), bytes
   per second of each.

Prints one JSON document. Usage: python bench/checkpoint_bench.py [--state-mib 256]
[--rank-mib 32] [--trials 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from shoal._checkpoint_files import (  # noqa: E402
    METADATA,
    METADATA_COPY,
    PIECE_BYTES,
    report_entry,
    step_directory,
)
from shoal._daemon import DaemonClient  # noqa: E402
from shoal.checkpoint import Checkpointer  # noqa: E402
from shoal.errors import DaemonUnreachableError  # noqa: E402
from shoal.place import RankPlace  # noqa: E402
from tests.cluster.cluster import free_port  # noqa: E402

MIB = 1 << 20
NAMES = ("c1", "c2", "c3")
RANKS = {0: "c1", 1: "c1", 2: "c2", 3: "c2", 4: "c3", 5: "c3"}


def _summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(samples), 4),
        "min_s": round(min(samples), 4),
        "samples_s": [round(s, 4) for s in samples],
    }


def _wait_for(path: Path, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:g} s")
        time.sleep(0.002)


def bench_save(directory: Path, state_mib: int, trials: int) -> dict[str, Any]:
    """Part 1: the loop's stall per save, blocking vs async (one checkpointer, as a training
    loop keeps it: its staging buffers are reused from the second save on), and DCP's load."""
    os.environ["SHOAL_CHECKPOINT_DIR"] = str(directory)
    warnings.filterwarnings("ignore", "torch.distributed is disabled")
    place = RankPlace(rank=0, local_rank=0, world_size=1, local_world_size=1, generation=0)
    state = {"w": torch.randn(state_mib * MIB // 4)}
    blocking, staged, written, loaded = [], [], [], []
    checkpointer = Checkpointer(place, None)
    for step in range(1, trials + 1):
        started = time.perf_counter()
        checkpointer.save(state, 2 * step - 1, blocking=True)
        blocking.append(time.perf_counter() - started)
        started = time.perf_counter()
        checkpointer.save(state, 2 * step)
        staged.append(time.perf_counter() - started)
        _wait_for(directory / step_directory(2 * step, 0) / METADATA)
        written.append(time.perf_counter() - started)
    checkpointer.close()
    for _ in range(trials):
        target = {"w": torch.zeros_like(state["w"])}
        started = time.perf_counter()
        assert Checkpointer(place, None).restore(target) == 2 * trials
        loaded.append(time.perf_counter() - started)
    size = state["w"].numel() * 4
    return {
        "state_bytes": size,
        "blocking_stall": _summary(blocking),
        "async_stall": _summary(staged),
        "async_write_total": _summary(written),
        "async_stall_share_of_blocking": round(
            statistics.median(staged) / statistics.median(blocking), 4
        ),
        "load_local": {**_summary(loaded), "bytes_per_s": round(size / statistics.median(loaded))},
    }


class Daemons:
    """Three `shoal serve` processes on loopback (every one a voter), each a node of its own."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.ports = {name: free_port() for name in NAMES}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for name in NAMES:
            config = {
                "voters": list(NAMES),
                "seeds": [f"127.0.0.1:{p}" for n, p in self.ports.items() if n != name],
                "mdns": False,
                "sync_interval_s": 0,
                "checkpoint_copy_after_s": 0,
            }
            path = base / f"{name}.yaml"
            path.write_text(json.dumps(config) + "\n", encoding="utf-8")
            env = {
                **os.environ,
                "SHOAL_CONFIG": str(path),
                "SHOAL_NODE_ID": name,
                "SHOAL_BIND": "127.0.0.1",
                "SHOAL_P2P_PORT": str(self.ports[name]),
                "SHOAL_DATA_DIR": str(self.data(name)),
            }
            with (base / f"{name}.log").open("wb") as log:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "node", "serve"],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        self.clients = {
            name: DaemonClient(f"http://127.0.0.1:{port}", timeout_s=600)
            for name, port in self.ports.items()
        }

    def data(self, name: str) -> Path:
        return self.base / name

    def root(self, name: str) -> Path:
        return self.data(name) / "checkpoints"

    def ask(self, name: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            return self.clients[name].exchange(method, path, body)
        except DaemonUnreachableError as exc:
            return 0, {"reason": str(exc)}

    def wait(self, probe: Callable[[], Any], timeout_s: float, what: str, every_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = probe()
            if found:
                return found
            time.sleep(every_s)
        raise TimeoutError(f"{what} did not happen within {timeout_s:g} s")

    def committed(self, step: int) -> dict[str, Any] | None:
        status, answer = self.ask("c1", "GET", "/v1/checkpoints")
        found = answer.get("committed") if status == 200 else None
        return found if found and found["step"] == step else None

    def report(self, node: str, step: int, rank: int, size: int) -> dict[str, Any]:
        """Rank `rank`'s file of `step` written on `node` (rank 0: the metadata too): the
        body of its written report."""
        directory = self.root(node) / step_directory(step, 1)
        directory.mkdir(parents=True, exist_ok=True)
        names = [f"__{rank}_0.distcp"]
        (directory / names[0]).write_bytes(os.urandom(size))
        if rank == 0:
            (directory / METADATA).write_bytes(b"metadata")
            os.link(directory / METADATA, directory / METADATA_COPY)
            names.append(METADATA_COPY)
        return {
            "step": step,
            "generation": 1,
            "rank": rank,
            "world_size": len(RANKS),
            "directory": directory.name,
            "piece_size": PIECE_BYTES,
            "files": [report_entry(directory, name) for name in names],
        }

    def coordinator_latencies(self) -> list[float]:
        """The coordinators' own commit latencies, from their log lines."""
        found = []
        for name in NAMES:
            text = (self.base / f"{name}.log").read_text(encoding="utf-8", errors="replace")
            found += [float(v) for v in re.findall(r"\(([0-9.]+) s after its last report", text)]
        return found

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _held_by_two_others(committed: dict[str, Any]) -> bool:
    holders = committed.get("holders") or {}
    return set(holders) == set(NAMES) and all(
        len(set(nodes) - {owner}) >= 2 for owner, nodes in holders.items()
    )


def _one_step(daemons: Daemons, step: int, rank_bytes: int) -> dict[str, Any]:
    bodies = {rank: daemons.report(node, step, rank, rank_bytes) for rank, node in RANKS.items()}
    last = max(RANKS)
    for rank, node in sorted(RANKS.items()):
        if rank != last:
            status, answer = daemons.ask(node, "POST", "/v1/checkpoints/written", bodies[rank])
            assert status == 202, answer
    time.sleep(1.5)  # the other reports reach the coordinator first
    started = time.monotonic()
    status, answer = daemons.ask(RANKS[last], "POST", "/v1/checkpoints/written", bodies[last])
    assert status == 202, answer
    daemons.wait(lambda: daemons.committed(step), 60, "the commit", 0.01)
    commit_s = time.monotonic() - started

    def copied() -> dict[str, Any] | None:
        found = daemons.committed(step)
        return found if found is not None and _held_by_two_others(found) else None

    committed = daemons.wait(copied, 300, "every node's files held by two others", 0.02)
    return {
        "committed": committed,
        "commit_s": commit_s,
        "replicate_s": time.monotonic() - started - commit_s,
    }


def _prepare(daemons: Daemons, node: str, step: int) -> dict[str, Any]:
    body = {"step": step, "generation": 1}
    deadline = time.monotonic() + 60
    while True:  # 503: no coordinator for a moment
        status, plan = daemons.ask(node, "POST", "/v1/checkpoints/prepare", body)
        if status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 200, plan
    return dict(plan)


def bench_cluster(directory: Path, rank_mib: int, trials: int) -> dict[str, Any]:
    """Part 2: commit latency, replication, restore local vs from peers."""
    commits, replications, local, peers = [], [], [], []
    step_bytes = 0
    directory.mkdir(parents=True, exist_ok=True)
    daemons = Daemons(directory)
    try:
        daemons.wait(
            lambda: all(daemons.ask(n, "GET", "/v1/checkpoints")[0] == 200 for n in NAMES),
            120,
            "three daemons and a coordinator",
            0.5,
        )
        for trial in range(trials):
            step = 20 * (trial + 1)
            result = _one_step(daemons, step, rank_mib * MIB)
            step_bytes = int(result["committed"]["bytes"])
            commits.append(result["commit_s"])
            replications.append(result["replicate_s"])
            local.append(_prepare(daemons, "c2", step))
            shutil.rmtree(daemons.root("c2"))
            daemons.root("c2").mkdir()
            peers.append(_prepare(daemons, "c2", step))
        at_coordinator = daemons.coordinator_latencies()
    finally:
        daemons.close()

    def restore(plans: list[dict[str, Any]], source: str) -> dict[str, Any]:
        assert all(plan["from"] == source for plan in plans), plans
        seconds = [float(plan["seconds"]) for plan in plans]
        return {
            **_summary(seconds),
            "bytes": step_bytes,
            "fetched_bytes": [plan["fetched_bytes"] for plan in plans],
            "bytes_per_s": round(step_bytes / statistics.median(seconds)),
        }

    copied = 2 * step_bytes
    return {
        "ranks": len(RANKS),
        "step_bytes": step_bytes,
        "commit_latency": _summary(commits),
        "commit_latency_at_coordinator": _summary(at_coordinator or [0.0]),
        "replication": {
            **_summary(replications),
            "bytes_copied": copied,
            "bytes_per_s": round(copied / statistics.median(replications)),
        },
        "restore_local": restore(local, "local"),
        "restore_from_peers": restore(peers, "peers"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mib", type=int, default=256)
    parser.add_argument("--rank-mib", type=int, default=32)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="shoal-ckpt-bench-", dir=args.dir))
    try:
        saves = base / "saves"
        saves.mkdir()
        result = {
            "bench": "checkpoint",
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "save": bench_save(saves, args.state_mib, args.trials),
            "cluster": bench_cluster(base / "cluster", args.rank_mib, args.trials),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
