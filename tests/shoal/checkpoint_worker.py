"""One rank of the resharding test: `save` writes a state of one sharded (DTensor, Shard(0)) and
one replicated tensor at steps 20 (async) and 40 (blocking); `restore` loads the newest into a
state of this world size and prints what it found as one JSON line. No daemon: the ranks share
SHOAL_CHECKPOINT_DIR; `fallback` restores through a stand-in daemon that commits both steps but
cannot have step 40's files on rank 1's node, so every rank must load step 20."""

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

import shoal.checkpoint
from shoal._checkpoint_files import step_directory
from shoal.checkpoint import Checkpointer
from shoal.errors import DaemonAnswerError
from shoal.place import RankPlace, place_from_env

ROWS = 24


def full(step: int) -> torch.Tensor:
    return torch.arange(ROWS * 3, dtype=torch.float32).reshape(ROWS, 3) + step


def state_at(step: int, mesh: object) -> dict[str, object]:
    sharded = distribute_tensor(full(step), mesh, [Shard(0)])  # type: ignore[arg-type]
    return {"model": {"sharded": sharded, "replicated": torch.full((5,), float(step))}}


class StandInDaemon:
    """Answers a restore's questions as a daemon whose newest committed step (40) this node
    cannot have when `lacking` (its only holders down); step 20 it can."""

    def __init__(self, place: RankPlace, lacking: bool) -> None:
        self.root = os.environ["SHOAL_CHECKPOINT_DIR"]
        self.generation = place.generation
        self.lacking = lacking

    def request(
        self, method: str, path: str, body: dict[str, int] | None = None, **_: object
    ) -> object:
        if path == shoal.checkpoint.CHECKPOINTS_PATH:
            steps = [{"step": step, "generation": self.generation} for step in (20, 40)]
            return {"committed": steps[-1], "steps": steps}
        assert body is not None
        if path == shoal.checkpoint.PREPARE_PATH:
            if body["step"] == 40 and self.lacking:
                raise DaemonAnswerError("stand-in", 503, "unavailable", "no holder answers")
            directory = step_directory(body["step"], body["generation"])
            return {"directory": os.path.join(self.root, directory)}
        return {"step": body["step"], "seconds": 0.0}


def main() -> None:
    mode = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    place = place_from_env(os.environ)
    mesh = init_device_mesh("cpu", (place.world_size,))
    checkpointer = Checkpointer(place, None)
    if mode == "fallback":
        shoal.checkpoint.FALLBACK_AFTER_S = 0.5
        shoal.checkpoint.RETRY_PAUSE_S = 0.1
        daemon = StandInDaemon(place, lacking=place.rank == 1)
        checkpointer = Checkpointer(place, daemon)  # type: ignore[arg-type]
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
