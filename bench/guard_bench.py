"""What the collective guard costs a training step: `shoal.guard.CollectiveGuard` (installed by
a session that re-forms in place) turns each blocking collective of the training thread into an
asynchronous one whose wait wakes when it ends and every `poll_s`. This measures all_reduce
beside the bare one, in the same run, on a gloo group of `--ranks` processes on this host: a
small tensor (the latency a guard adds) and a large one (the share of a real gradient sync).

Each size runs bare, then guarded, then bare and guarded again (the median of the rounds), all
ranks in lockstep; the time is rank 0's wall time per call. Prints JSON:
`{"ranks", "sizes": [{"bytes", "bare_us", "guarded_us", "overhead_us", "ratio"}]}`.

Usage: .venv/bin/python bench/guard_bench.py [--ranks 2] [--calls 2000] [--big-mib 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cluster.cluster import free_port  # noqa: E402

ROUNDS = 2
SMALL_BYTES = 4096


def _timed(dist: Any, tensor: Any, calls: int) -> float:
    """Seconds per all_reduce of `tensor` over `calls` calls, after a barrier."""
    dist.barrier()
    started = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(tensor)
    return (time.perf_counter() - started) / calls


def _rank_main(rank: int, ranks: int, port: int, sizes: list[int], calls: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from shoal.guard import _WRAPPED, CollectiveGuard

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    guard = CollectiveGuard(60.0, lambda: None)
    figures = []
    for size in sizes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32)
        _timed(dist, tensor, max(10, calls // 20))  # warm the connections
        bare, guarded = [], []
        for _ in range(ROUNDS):
            bare.append(_timed(dist, tensor, calls))
            guard.install(dist)
            if not hasattr(dist.all_reduce, _WRAPPED):
                raise RuntimeError("the guard did not wrap all_reduce: nothing to measure")
            try:
                guarded.append(_timed(dist, tensor, calls))
            finally:
                guard.uninstall()
        figures.append({"bytes": size, "bare": bare, "guarded": guarded})
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(figures))


def _summary(figures: list[dict[str, Any]]) -> list[dict[str, float]]:
    rows = []
    for row in figures:
        bare = round(statistics.median(row["bare"]) * 1e6, 1)
        guarded = round(statistics.median(row["guarded"]) * 1e6, 1)
        rows.append(
            {
                "bytes": row["bytes"],
                "bare_us": bare,
                "guarded_us": guarded,
                "overhead_us": round(guarded - bare, 1),
                "ratio": round(guarded / bare, 3),
            }
        )
    return rows


def run(ranks: int, calls: int, big_bytes: int) -> dict[str, Any]:
    """Start `ranks` processes, measure, stop them; the JSON figures."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="shoal-guard-bench-") as scratch:
        out = str(Path(scratch) / "figures.json")
        sizes = [SMALL_BYTES, big_bytes]
        args = (ranks, free_port(), sizes, calls, out)
        mp.start_processes(_rank_main, args=args, nprocs=ranks, join=True, start_method="spawn")
        figures = json.loads(Path(out).read_text())
    return {"ranks": ranks, "calls": calls, "sizes": _summary(figures)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000, help="all_reduces per round and size")
    parser.add_argument("--big-mib", type=float, default=4.0, help="the large tensor, in MiB")
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.calls < 1 or args.big_mib <= 0:
        parser.error("--ranks must be at least 2, --calls and --big-mib above 0")
    print(json.dumps(run(args.ranks, args.calls, int(args.big_mib * (1 << 20))), indent=2))


if __name__ == "__main__":
    main()
