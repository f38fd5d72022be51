"""Checkpoint costs, each beside its reference from the same run.

1. Save: how long `Checkpointer.save` holds the training loop for a state of --state-mib,
   blocking (the whole DCP write, fsync included) vs async (staging the copy; the write goes
   on in the background, its duration also given); and DCP's load of it from local disk.
   One process, no daemon.
2. Cluster (3 daemons on loopback in this process, every one a voter; 6 ranks, 2 per node,
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
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from aiohttp import ClientSession  # noqa: E402

from shoal.checkpoint import Checkpointer  # noqa: E402
from shoal.place import RankPlace  # noqa: E402
from tests.node.checkpoints.cluster import NAMES, Cluster, eventually  # noqa: E402

MIB = 1 << 20
RANKS = {0: "c1", 1: "c1", 2: "c2", 3: "c2", 4: "c3", 5: "c3"}


def _summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(samples), 4),
        "min_s": round(min(samples), 4),
        "samples_s": [round(s, 4) for s in samples],
    }


def bench_save(directory: Path, state_mib: int, trials: int) -> dict[str, Any]:
    """Part 1: the loop's stall per save, blocking vs async, and DCP's load."""
    os.environ["SHOAL_CHECKPOINT_DIR"] = str(directory)
    warnings.filterwarnings("ignore", "torch.distributed is disabled")
    place = RankPlace(rank=0, local_rank=0, world_size=1, local_world_size=1, generation=0)
    state = {"w": torch.randn(state_mib * MIB // 4)}
    blocking, staged, written, loaded = [], [], [], []
    step = 0
    for _ in range(trials):
        checkpointer = Checkpointer(place, None)
        step += 1
        started = time.perf_counter()
        checkpointer.save(state, step, blocking=True)
        blocking.append(time.perf_counter() - started)
        step += 1
        started = time.perf_counter()
        checkpointer.save(state, step)
        staged.append(time.perf_counter() - started)
        checkpointer.close()
        written.append(time.perf_counter() - started)
        target = {"w": torch.zeros_like(state["w"])}
        started = time.perf_counter()
        assert Checkpointer(place, None).restore(target) == step
        loaded.append(time.perf_counter() - started)
        shutil.rmtree(directory)
        directory.mkdir()
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


def _held_by_two_others(committed: dict[str, Any]) -> bool:
    holders = committed.get("holders") or {}
    return set(holders) == set(NAMES) and all(
        len(set(nodes) - {owner}) >= 2 for owner, nodes in holders.items()
    )


async def _one_step(cluster: Cluster, step: int, rank_bytes: int) -> dict[str, Any]:
    for rank, node in sorted(RANKS.items())[:-1]:
        await cluster.write_rank(node, step, 1, rank, len(RANKS), rank_bytes)
    last_rank, last_node = max(RANKS.items())
    await asyncio.sleep(1.0)  # the other reports reach the coordinator first
    started = time.monotonic()
    status, answer = await cluster.write_rank(last_node, step, 1, last_rank, len(RANKS), rank_bytes)
    assert status == 202, answer
    committed = await eventually(lambda: cluster.committed(step), 60, "the commit", 0.02)
    commit_s = time.monotonic() - started
    copied_at = time.monotonic()

    async def copied() -> dict[str, Any] | None:
        found = await cluster.committed(step)
        return found if found is not None and _held_by_two_others(found) else None

    committed = await eventually(copied, 300, "every node's files held by two others", 0.05)
    replicate_s = time.monotonic() - copied_at
    return {"committed": committed, "commit_s": commit_s, "replicate_s": replicate_s}


async def _prepare(cluster: Cluster, node: str, step: int) -> dict[str, Any]:
    body = {"step": step, "generation": 1}
    started = time.monotonic()
    status, plan = await cluster.call(node, "POST", "/v1/checkpoints/prepare", body)
    assert status == 200, plan
    return {**plan, "wall_s": time.monotonic() - started}


async def bench_cluster(directory: Path, rank_mib: int, trials: int) -> dict[str, Any]:
    """Part 2: commit latency, replication, restore local vs from peers."""
    commits, replications, local, peers = [], [], [], []
    step_bytes = 0
    office_latencies: list[float] = []
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(ClientSession())
        cluster = Cluster(directory, stack, session)
        await cluster.start()
        for trial in range(trials):
            step = 20 * (trial + 1)
            result = await _one_step(cluster, step, rank_mib * MIB)
            step_bytes = int(result["committed"]["bytes"])
            commits.append(result["commit_s"])
            replications.append(result["replicate_s"])
            local.append(await _prepare(cluster, "c2", step))
            shutil.rmtree(cluster.root("c2"))
            cluster.root("c2").mkdir()
            peers.append(await _prepare(cluster, "c2", step))
        coordinator = cluster.coordinator()
        if coordinator is not None:
            office_latencies = list(cluster.service(coordinator).office.commit_latencies_s)

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
        "commit_latency_at_coordinator": _summary(office_latencies or [0.0]),
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
            "cluster": asyncio.run(bench_cluster(base / "cluster", args.rank_mib, args.trials)),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
