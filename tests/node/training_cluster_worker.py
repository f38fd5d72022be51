"""The training command of the cluster tests: `shoal.training_session()`, a fixed compute time
per step (TRAIN_COMPUTE_S times TRAIN_SLOW), an all_reduce, a report. The tests copy it into a
directory that holds its own config.py, net.py, wal.py, health.py, sync.py and node.py, and the
launcher runs it from there, as a training repository's script runs.

Appends {"event": "start", "pid", "rank", "generation", "exec_at", "at"} to $WORKER_OUT once the
group formed (`exec_at`: when the process started, before it imported torch), and
{"event": "step", ..., "at"} once its first step is done (unix seconds).
"""

from __future__ import annotations

import json
import os
import time
import warnings

EXEC_AT = time.time()

import shoal  # noqa: E402

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    import torch
    import torch.distributed as dist


def main() -> None:
    compute_s = float(os.environ.get("TRAIN_COMPUTE_S", "0.02"))
    compute_s *= float(os.environ.get("TRAIN_SLOW", "1"))
    with shoal.training_session() as session:
        import config  # the script's own module, not shoal's package of that name
        import node

        assert (config.DECOY, node.DECOY) == ("config", "node")
        place = {"pid": os.getpid(), "rank": session.rank, "generation": session.generation}
        record({"event": "start", **place, "exec_at": EXEC_AT, "at": time.time()})
        step = 0
        while True:
            time.sleep(compute_s)
            dist.all_reduce(torch.ones(1))
            session.report(step, loss=1.0 / (step + 1))
            if step == 0:
                record({"event": "step", **place, "at": time.time()})
            step += 1


def record(line: dict[str, object]) -> None:
    with open(os.environ["WORKER_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
