"""Work functions the worker tests run (importable as module:function by a worker server)."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

from node.workers import NCCLConfig, WorkerHandle, setup_nccl_env


def echo(handle: WorkerHandle) -> None:
    """Answer every message with itself (and its payload)."""
    while True:
        frame = handle.recv_frame()
        handle.send(frame.message, frame.payload or None)


def compute(handle: WorkerHandle) -> None:
    """{"op": "sum"} with a payload of doubles: their sum; {"op": "square", "x": n}: n*n."""
    while True:
        frame = handle.recv_frame()
        if frame.message["op"] == "sum":
            values = struct.unpack(f"<{len(frame.payload) // 8}d", frame.payload)
            handle.send({"sum": sum(values), "pid": os.getpid()})
        else:
            handle.send({"square": frame.message["x"] ** 2})


def marker(handle: WorkerHandle) -> None:
    """Touch $SHOAL_TEST_MARKER as soon as the worker runs, then echo."""
    Path(os.environ["SHOAL_TEST_MARKER"]).touch()
    echo(handle)


def crash(handle: WorkerHandle) -> None:
    """On the first message: a line on stderr, then exit 3."""
    handle.recv()
    print("about to fail: the sky is falling", file=sys.stderr, flush=True)
    sys.exit(3)


def crash_loudly(handle: WorkerHandle) -> None:
    """On the first message: 64 MiB on stderr, then a last line, then exit 3."""
    handle.recv()
    block = "x" * 1023 + "\n"
    for _ in range(64 * 1024):
        sys.stderr.write(block)
    print("the last line", file=sys.stderr, flush=True)
    sys.exit(3)


def rank_report(handle: WorkerHandle) -> None:
    """Take an NCCL config, set the environment from it and answer what torch would read."""
    config = NCCLConfig.from_message(handle.recv())
    setup_nccl_env(config)
    keys = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
    handle.send({"env": {k: os.environ[k] for k in keys}, "pid": os.getpid()})
    echo(handle)
