"""A small model trained across the cluster that survives a killed node.

Every node of a dev cluster runs this script as its `training_command` (`shoal dev-cluster
--train` sets that up); plain torchrun runs it too (`torchrun --nproc-per-node 2
examples/train.py`). Each step takes `--step-s` of "compute" (a sleep beside a real forward and
backward pass), then averages the gradients over the group with one all_reduce. Every
`--save-s` seconds of steps the state is saved; the cluster commits a step once every rank
wrote it.

When the group changes (a node killed, hung, quarantined, partitioned away or back, a worker
exited) the daemons start a new generation. By default every process of the group starts again
and `session.restore` loads the newest step the cluster committed (fetched from peers first on
a host that lacks its files: a replaced disk). With `training_reform: in_place` the processes
that still run stay: their all_reduce raises `shoal.GroupChanged`, `session.reform` joins the
next generation, and the newest step any of them holds in memory is sent to the ranks that lack
it (a restarted worker, a host back), so no step is redone. Under plain torchrun the agents
restart the group instead, and restore from the checkpoint directory the ranks share
(SHOAL_CHECKPOINT_DIR).

With `--progress DIR` each process appends JSON lines to DIR/<node>-<pid>.jsonl: its start,
its restore, and (rank 0) every step and every save; bench/goodput_bench.py reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any

import shoal

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


class TrainState:
    """The model and its optimizer as one checkpointable entry (DCP's Stateful protocol)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )


class Progress:
    """JSON lines for the goodput bench (nothing without `--progress`)."""

    def __init__(self, directory: str | None, node: str | None) -> None:
        node = node or socket.gethostname()
        self.node = node
        self.path = None if directory is None else Path(directory) / f"{node}-{os.getpid()}.jsonl"

    def joined(
        self,
        event: str,
        session: shoal.TrainingSession,
        step: int,
        started: float,
        model: torch.nn.Module,
    ) -> None:
        """`event` (restored, reformed): where this rank joined, the step it goes on from, how
        long it took since `started`, its weights' digest and where its state came from."""
        self.write(
            event,
            step=step,
            generation=session.generation,
            rank=session.rank,
            world=session.world_size,
            seconds=round(time.monotonic() - started, 3),
            digest=digest(model),
            **reform_fields(session),
        )

    def write(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = {"event": event, "t": time.time(), "pid": os.getpid(), "node": self.node, **fields}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, width: int, step_s: float
) -> float:
    """One step: forward and backward on a small batch, `step_s` of compute in all, gradients
    averaged over the group in one all_reduce, then the update."""
    started = time.perf_counter()
    batch = torch.randn(32, width)
    loss = torch.nn.functional.mse_loss(model(batch), batch)
    optimizer.zero_grad()
    torch.autograd.backward(loss)
    time.sleep(max(0.0, step_s - (time.perf_counter() - started)))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    optimizer.step()
    return float(loss.item())


def digest(model: torch.nn.Module) -> float:
    """The sum of the model's weights: equal on every rank of a group that holds one state."""
    with torch.no_grad():
        return round(float(sum(p.double().sum() for p in model.parameters())), 9)


def reform_fields(session: shoal.TrainingSession) -> dict[str, Any]:
    """In place: where this rank's state came from (memory, peer, checkpoint), its bytes."""
    reform = session.last_reform
    if reform is None:
        return {}
    return {"source": reform.source, "bytes": reform.bytes, "from_rank": reform.from_rank}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=0, help="stop after this step (0: never)")
    parser.add_argument("--step-s", type=float, default=0.1, help="compute time of one step")
    parser.add_argument("--save-s", type=float, default=10.0, help="save about this often")
    parser.add_argument("--width", type=int, default=256, help="the model's width")
    parser.add_argument("--progress", default=None, help="a directory for JSON progress lines")
    # not --node: torchrun would take it for its --node-rank (argparse abbreviations)
    parser.add_argument("--name", default=None, help="the name in progress lines (hostname)")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    progress = Progress(args.progress, args.name)
    progress.write("start")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, args.width),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"train": TrainState(model, optimizer)}
    save_every = max(1, round(args.save_s / args.step_s))
    with shoal.training_session() as session:
        started = time.monotonic()
        step = session.restore(state) or 0
        progress.joined("restored", session, step, started, model)
        while not args.steps or step < args.steps:
            try:
                loss = train_step(model, optimizer, args.width, args.step_s)
            except shoal.GroupChanged as change:
                # training_reform: in_place (never under plain torchrun): the group changed
                # under the all_reduce; join the next one with the state of the newest step
                # any live rank holds, and redo the step
                progress.write("group_changed", step=step, reason=change.reason)
                started = time.monotonic()
                step = session.reform(state, step) or 0
                progress.joined("reformed", session, step, started, model)
                continue
            step += 1
            session.report(step, loss=loss)
            if session.rank == 0:
                progress.write(
                    "step", step=step, generation=session.generation, world=session.world_size
                )
            if step % save_every == 0:
                session.save(state, step)
                if session.rank == 0:
                    progress.write("saved", step=step, generation=session.generation)
        if step % save_every:
            session.save(state, step, blocking=True)
    print(f"rank {session.rank}: done at step {step}", flush=True)


if __name__ == "__main__":
    main()
