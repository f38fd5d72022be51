"""The training command of the cluster tests: `shoal.training_session()`, a fixed compute time
per step (TRAIN_COMPUTE_S times TRAIN_SLOW), an all_reduce, a report. The tests copy it into a
directory that holds its own config.py, net.py, wal.py, health.py, sync.py and node.py, and the
launcher runs it from there, as a training repository's script runs.

Appends {"event": "start", "pid", "rank", "generation"} to $WORKER_OUT once the group formed.
"""

from __future__ import annotations

import json
import os
import time
import warnings

import shoal

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
        line = {"event": "start", "pid": os.getpid(), "rank": session.rank}
        line["generation"] = session.generation
        with open(os.environ["WORKER_OUT"], "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        step = 0
        while True:
            time.sleep(compute_s)
            dist.all_reduce(torch.ones(1))
            session.report(step, loss=1.0 / (step + 1))
            step += 1


if __name__ == "__main__":
    main()
