"""A training process for tests/node/test_groups_netns.py: join the elastic group through the
local daemon, then gloo all_reduce in a loop, re-forming the group whenever it breaks or changes.

usage: groups_netns_worker.py DAEMON_URL SECRET_FILE [COLLECTIVE_S]

Prints one JSON line per event: {"event": "joined"|"reduced"|"failed"|"regroup_failed",
"t": MONOTONIC, "pid", ...}; "joined" and "reduced" carry "generation", "rank", "world_size",
"reduced" the sum "value" of rank + 1 over the group, the failures an "error". Runs until killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

from config import Timeouts
from node.errors import GroupError
from node.training.groups import ElasticGroup, join_group

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    import torch
    import torch.distributed as dist

REGROUP_S = 30.0


def emit(event: str, group: ElasticGroup | None = None, **fields: object) -> None:
    line: dict[str, object] = {"event": event, "t": time.monotonic(), "pid": os.getpid()}
    if group is not None:
        line.update(generation=group.generation, rank=group.rank, world_size=group.world_size)
    print(json.dumps({**line, **fields}), flush=True)


def regroup(group: ElasticGroup) -> None:
    """Re-form the group, retrying until it forms (each try bounded by REGROUP_S)."""
    while True:
        try:
            group.regroup(timeout_s=REGROUP_S)
        except GroupError as exc:
            emit("regroup_failed", error=str(exc).splitlines()[0][:300])
            time.sleep(0.2)
            continue
        emit("joined", group)
        return


def main() -> None:
    daemon_url, secret_file = sys.argv[1], sys.argv[2]
    collective_s = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    timeouts = Timeouts(collective_s=collective_s, quorum_s=collective_s * 2)
    group = join_group(
        timeout_s=60.0,
        daemon_url=daemon_url,
        secret_file=secret_file,
        timeouts=timeouts,
        changed_interval_s=0.2,
    )
    emit("joined", group)
    while True:
        tensor = torch.tensor([float(group.rank + 1)])
        try:
            dist.all_reduce(tensor)
        except RuntimeError as exc:  # a rank died or left: DistBackendError is a RuntimeError
            emit("failed", error=str(exc).splitlines()[0][:300])
            regroup(group)
            continue
        emit("reduced", group, value=tensor.item())
        if group.changed():
            regroup(group)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
