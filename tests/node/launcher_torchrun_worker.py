"""A plain torchrun-style training command for the launcher tests: `init_process_group` from the
environment (gloo), then `all_reduce` of RANK + 1 in a loop; it crashes like any plain script
when a peer dies.

Appends JSON lines to $WORKER_OUT: {"event": "start", "pid", "env": {the torchrun variables}}
once torch is imported, {"event": "reduced", "pid", "rank", "world_size", "value", "restart"}
after the first all_reduce, {"event": "failed", "pid", "error"} before exiting 1.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    import torch
    import torch.distributed as dist

KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "SHOAL_GENERATION",
    "SHOAL_DAEMON_URL",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)


def record(event: str, **fields: object) -> None:
    line = {"event": event, "pid": os.getpid(), "t": time.monotonic(), **fields}
    with open(os.environ["WORKER_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def main() -> None:
    record("start", env={key: os.environ.get(key) for key in KEYS})
    timeout = datetime.timedelta(seconds=float(os.environ.get("WORKER_TIMEOUT_S", "30")))
    try:
        dist.init_process_group("gloo", timeout=timeout)
        reported = False
        while True:
            value = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(value)
            if not reported:
                record(
                    "reduced",
                    rank=dist.get_rank(),
                    world_size=dist.get_world_size(),
                    value=value.item(),
                    restart=os.environ["TORCHELASTIC_RESTART_COUNT"],
                )
                reported = True
            time.sleep(0.05)
    except RuntimeError as exc:
        record("failed", error=str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        sys.exit(1)


if __name__ == "__main__":
    main()
