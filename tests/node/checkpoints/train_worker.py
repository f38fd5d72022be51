"""The training command of the checkpoint cluster test, run by each daemon's launcher as
`training_nproc` workers: restore the newest committed step, then train (the state after step s
is s everywhere: a tensor sharded over the ranks as FSDP shards parameters, so every rank
writes its own part), all_reduce every step, save every SAVE_EVERY steps.

It drives shoal.checkpoint.Checkpointer itself; with `shoal.training_session()` the three lines
marked SESSION become `session = shoal.training_session()`, `session.restore(state)` and
`session.save(state, step)`.

Appends JSON lines to $WORKER_OUT: {"event": "restored", "pid", "rank", "world_size",
"generation", "daemon", "step", "w" (the values in its shard), "state_step"} once restored,
{"event": "saved", ..., "step"} after each save, {"event": "failed", ..., "error"} before
exiting 1.
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
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from shoal._daemon import DaemonClient
from shoal.checkpoint import Checkpointer
from shoal.place import place_from_env

SAVE_EVERY = 20
ROWS = 24
"""Rows of the sharded state: divisible by every world size the test runs (6, 4)."""
STEP_S = float(os.environ.get("WORKER_STEP_S", "0.05"))


def record(event: str, **fields: object) -> None:
    line = {
        "event": event,
        "pid": os.getpid(),
        "t": time.time(),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "generation": int(os.environ.get("SHOAL_GENERATION", "0")),
        "daemon": os.environ.get("SHOAL_DAEMON_URL"),
        **fields,
    }
    with open(os.environ["WORKER_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("WORKER_TIMEOUT_S", "30")))
    dist.init_process_group("gloo", timeout=timeout)
    checkpointer = Checkpointer(place_from_env(os.environ), DaemonClient.from_env())  # SESSION
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    w = distribute_tensor(torch.zeros(ROWS, 256), mesh, [Shard(0)])
    state = {"w": w, "step": torch.tensor(0)}
    restored = checkpointer.restore(state)  # SESSION
    shard = state["w"].to_local() if isinstance(state["w"], DTensor) else state["w"]
    values = sorted({float(v) for v in shard.flatten().tolist()})
    record("restored", step=restored, w=values, state_step=int(state["step"].item()))
    step = restored or 0
    while True:
        step += 1
        state["w"] += 1.0
        state["step"] = torch.tensor(step)
        dist.all_reduce(torch.ones(1))
        time.sleep(STEP_S)
        if step % SAVE_EVERY == 0:
            checkpointer.save(state, step)  # SESSION
            record("saved", step=step)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:
        record("failed", error=str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
        sys.exit(1)
