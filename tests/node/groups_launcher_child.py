"""A training command for the launcher tests; appends one JSON line per event to $CHILD_OUT.

$CHILD_MODE: "run" (until SIGTERM), "crash" (exit 3 at once), "crash-once" (exit 3 at once in
the first start of a generation, TORCHELASTIC_RESTART_COUNT 0, else run), "finish" (exit 0 at
once), "stubborn" (ignore SIGTERM, run until SIGKILL); $CHILD_MODE_<LOCAL_RANK> overrides it for
one local rank. Events: {"event": "start"|"term", "pid",
"t": MONOTONIC, "env": {the torchrun variables, None when unset}}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
    "SHOAL_GENERATION",
)


def record(event: str) -> None:
    line = {
        "event": event,
        "pid": os.getpid(),
        "t": time.monotonic(),
        "cwd": os.getcwd(),
        "extra": os.environ.get("CHILD_EXTRA"),
        "after": os.environ.get("SHOAL_AFTER_GENERATION"),
        "env": {key: os.environ.get(key) for key in KEYS},
    }
    with open(os.environ["CHILD_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def on_term(signum: int, frame: object) -> None:
    record("term")
    sys.exit(0)


def main() -> None:
    mode = os.environ.get("CHILD_MODE", "run")
    mode = os.environ.get(f"CHILD_MODE_{os.environ.get('LOCAL_RANK')}", mode)
    if mode == "crash-once":
        mode = "crash" if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" else "run"
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    record("start")
    print(f"child {os.getpid()} mode {mode}", flush=True)
    if mode == "crash":
        sys.exit(3)
    if mode == "finish":
        sys.exit(0)
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
