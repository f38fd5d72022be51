"""One training process of a node-major group test: join_group with LOCAL_RANK from the
environment, all_reduce rank + 1 once, print the result as one JSON line, leave.

usage: groups_local_worker.py DAEMON_URL
"""

from __future__ import annotations

import json
import sys
import warnings

from config import Timeouts
from node.training.groups import join_group

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    import torch
    import torch.distributed as dist


def main() -> None:
    timeouts = Timeouts(collective_s=30.0, quorum_s=60.0)
    with join_group(timeout_s=60, daemon_url=sys.argv[1], timeouts=timeouts) as group:
        tensor = torch.tensor([float(group.rank + 1)])
        dist.all_reduce(tensor)
        rendezvous = group.rendezvous
        line = {
            "rank": group.rank,
            "local_rank": group.local_rank,
            "local_world_size": group.local_world_size,
            "node_rank": rendezvous.node_rank,
            "world_size": group.world_size,
            "sum": tensor.item(),
        }
        dist.barrier()
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
