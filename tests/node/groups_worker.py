"""A training process for the elastic group tests: join_group, then all_reduce in a loop.

usage: groups_worker.py DAEMON_URL [COLLECTIVE_S]

Prints one JSON line per event: {"event", "t": MONOTONIC, "pid", ...}, where event is "joining"
(torch is imported), "joined", "reduced" (with "value"), "changed" or "failed" (with "error");
all but joining and failed carry "generation", "rank" and "world_size". all_reduce sums rank + 1
over the group. Runs until killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

from config import Timeouts
from node.training.groups import ElasticGroup, join_group

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    import torch
    import torch.distributed as dist


def emit(event: str, group: ElasticGroup, **fields: object) -> None:
    line = {"event": event, "t": time.monotonic(), "pid": os.getpid(), **fields}
    if event != "failed":
        line.update(generation=group.generation, rank=group.rank, world_size=group.world_size)
    print(json.dumps(line), flush=True)


def main() -> None:
    daemon_url = sys.argv[1]
    collective_s = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    timeouts = Timeouts(collective_s=collective_s, quorum_s=collective_s * 4)
    print(json.dumps({"event": "joining", "t": time.monotonic(), "pid": os.getpid()}), flush=True)
    group = join_group(
        timeout_s=30, daemon_url=daemon_url, timeouts=timeouts, changed_interval_s=0.2
    )
    emit("joined", group)
    while True:
        tensor = torch.tensor([float(group.rank + 1)])
        try:
            dist.all_reduce(tensor)
        except RuntimeError as exc:
            emit("failed", group, error=str(exc).splitlines()[0][:200])
            group.regroup(timeout_s=30)
            emit("joined", group)
            continue
        emit("reduced", group, value=tensor.item())
        if group.changed():
            emit("changed", group)
            group.regroup(timeout_s=30)
            emit("joined", group)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
