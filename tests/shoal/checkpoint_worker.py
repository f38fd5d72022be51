"""One rank of the resharding test: `save` writes a state of one sharded (DTensor, Shard(0)) and
one replicated tensor at steps 20 (async) and 40 (blocking); `restore` loads the newest into a
state of this world size and prints what it found as one JSON line. No daemon: the ranks share
SHOAL_CHECKPOINT_DIR."""

from __future__ import annotations

import datetime
import json
import os
import sys
import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from shoal.checkpoint import Checkpointer
from shoal.place import place_from_env

ROWS = 24


def full(step: int) -> torch.Tensor:
    return torch.arange(ROWS * 3, dtype=torch.float32).reshape(ROWS, 3) + step


def state_at(step: int, mesh: object) -> dict[str, object]:
    sharded = distribute_tensor(full(step), mesh, [Shard(0)])  # type: ignore[arg-type]
    return {"model": {"sharded": sharded, "replicated": torch.full((5,), float(step))}}


def main() -> None:
    mode = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    place = place_from_env(os.environ)
    mesh = init_device_mesh("cpu", (place.world_size,))
    checkpointer = Checkpointer(place, None)
    if mode == "save":
        checkpointer.save(state_at(20, mesh), 20)
        checkpointer.save(state_at(40, mesh), 40, blocking=True)
        checkpointer.close()
        failure = checkpointer.failure()
        print(
            json.dumps({"rank": place.rank, "failure": None if failure is None else str(failure)})
        )
    else:
        state = state_at(0, mesh)
        step = checkpointer.restore(state)
        model = state["model"]
        assert isinstance(model, dict)
        sharded = model["sharded"]
        assert isinstance(sharded, DTensor)
        local = sharded.to_local()
        rows = ROWS // place.world_size
        expected = full(step or 0)[place.rank * rows : (place.rank + 1) * rows]
        print(
            json.dumps(
                {
                    "rank": place.rank,
                    "step": step,
                    "shard_matches": bool(torch.equal(local, expected)),
                    "replicated": model["replicated"].tolist(),  # type: ignore[attr-defined]
                }
            )
        )
        checkpointer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
