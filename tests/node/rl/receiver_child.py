"""A generator process for the publish tests: catches up from the weights file, then receives
every offer into a small model and prints one JSON line per applied version. Fault injection
(like torchft's fail_at): argv[4] "stop:V" or "kill:V" stops or kills this process inside
`pause` of version V, i.e. after it joined the broadcast and before it received anything."""

from __future__ import annotations

import json
import os
import signal
import sys

import torch

from node.errors import WeightsError
from node.rl.receiver import WeightReceiver


def make_model() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def main() -> None:
    daemon_url, run, models_dir, fault = sys.argv[1:5]
    kind, _, at = fault.partition(":")
    model = make_model()
    receiver = WeightReceiver(run, daemon_url, models_dir=models_dir)
    version = receiver.catch_up(model)
    print(
        json.dumps({"event": "started", "version": version, "source": receiver.source}), flush=True
    )

    def pause() -> None:
        offered = receiver.offered_version()
        if kind in ("stop", "kill") and offered == int(at):
            os.kill(os.getpid(), signal.SIGSTOP if kind == "stop" else signal.SIGKILL)

    while True:
        try:
            got = receiver.receive_into(model, pause=pause, timeout_s=5.0)
        except WeightsError as exc:
            print(json.dumps({"event": "failed", "reason": str(exc)[:300]}), flush=True)
            continue
        if got is not None:
            print(
                json.dumps({"event": "applied", "version": got, "source": receiver.source}),
                flush=True,
            )


if __name__ == "__main__":
    main()
