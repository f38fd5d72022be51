"""One rank of tests/shoal/test_live.py: a gloo group of WORLD ranks on 127.0.0.1:PORT; rank r
holds live state at step STEPS[r] (a model whose weights are all that step, an Adam optimizer
that took one step, a plain tensor and a number) or nothing ("none": a new process). It agrees
with the others, receives or sends the newest state, then agrees again. Prints one JSON line:
the holdings, the transfer, and a digest of the state it ends with.
"""

from __future__ import annotations

import datetime
import json
import sys
import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
    import torch
    import torch.distributed as dist

from shoal.live import agree, share_state


def make_state(step: int | None) -> dict[str, object]:
    torch.manual_seed(1234)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    plain = torch.zeros(5)
    if step is not None:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float(step))
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        plain.fill_(float(step))
    return {"model": model, "optimizer": optimizer, "plain": plain, "epoch": step or 0}


def digest(state: dict[str, object]) -> dict[str, object]:
    model = state["model"]
    optimizer = state["optimizer"]
    assert isinstance(model, torch.nn.Module)
    assert isinstance(optimizer, torch.optim.Optimizer)
    moments = [
        round(float(s["exp_avg"].sum()), 6) for s in optimizer.state_dict()["state"].values()
    ]
    plain = state["plain"]
    assert isinstance(plain, torch.Tensor)
    return {
        "weights": [round(float(p.detach().sum()), 6) for p in model.parameters()],
        "moments": moments,
        "plain": round(float(plain.sum()), 6),
        "epoch": state["epoch"],
    }


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    steps = [None if s == "none" else int(s) for s in sys.argv[4].split(",")]
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    state = make_state(steps[rank])
    holding = agree(steps[rank])
    transfer = share_state(state, holding, rank)
    after = agree(holding.newest)
    again = share_state(state, after, rank)
    print(
        json.dumps(
            {
                "rank": rank,
                "steps": list(holding.steps),
                "newest": holding.newest,
                "source": holding.source,
                "transfer": None
                if transfer is None
                else {
                    "step": transfer.step,
                    "source": transfer.source,
                    "receivers": list(transfer.receivers),
                    "size_bytes": transfer.size_bytes,
                },
                "again": again is not None,
                "state": digest(state),
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
