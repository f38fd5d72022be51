"""Round trips per second of the work plane's Python API, measured in one run on loopback:
a no-op `Worker` and `RemoteWorker` send/recv beside a plain `multiprocessing` pipe, and
`run`+`get` and actor calls on the `shoal` backend (a `shoal serve` child, workers started as
jobs) beside the `ray` backend (a local Ray). Synchronous: one call at a time; pipelined: all
calls sent, then all results taken.

Prints one JSON document. Targets: shoal actor calls >= 500/s synchronous, >= 2,000/s pipelined.
Usage: python bench/tasks_bench.py [--calls 2000] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from node.tasks.shoal import ShoalContext  # noqa: E402
from node.workers import RemoteWorker, Worker, WorkerHandle, WorkerServer  # noqa: E402
from tests.node.jobs.client_daemon import served_node  # noqa: E402


def noop(x: int) -> int:
    return x


class Echo:
    def call(self, x: int) -> int:
        return x


def echo(handle: WorkerHandle) -> None:
    while True:
        handle.send(handle.recv())


def pipe_echo(conn: Connection) -> None:
    while True:
        conn.send(conn.recv())


def rate(calls: int, body: Callable[[], None]) -> float:
    started = time.perf_counter()
    body()
    return round(calls / (time.perf_counter() - started), 1)


def round_trips(send: Callable[[Any], None], recv: Callable[[], Any], calls: int) -> float:
    def body() -> None:
        for i in range(calls):
            send(i)
            recv()

    return rate(calls, body)


def measure_pipe(calls: int) -> float:
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=pipe_echo, args=(theirs,))
    process.start()
    try:
        return round_trips(ours.send, ours.recv, calls)
    finally:
        process.kill()
        process.join()


def measure_workers(calls: int) -> dict[str, float]:
    with Worker(echo) as local:
        local_rate = round_trips(local.send, lambda: local.recv(timeout_s=30), calls)
    server = WorkerServer(echo, "127.0.0.1", 0, max_workers=1)
    pid = os.fork()
    if pid == 0:
        server.serve_forever()
        os._exit(0)
    try:
        with RemoteWorker("127.0.0.1", server.port) as remote:
            remote_rate = round_trips(remote.send, lambda: remote.recv(timeout_s=30), calls)
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    return {"worker_local": local_rate, "remote_worker": remote_rate}


def measure_context(ctx: Any, calls: int) -> dict[str, float]:
    actor = ctx.create_actor(Echo)
    ctx.get(actor.call.remote(0), timeout_s=60)
    ctx.get(ctx.run(noop, 0), timeout_s=60)

    def tasks_sync() -> None:
        for i in range(calls):
            ctx.get(ctx.run(noop, i), timeout_s=60)

    def tasks_pipelined() -> None:
        futures = [ctx.run(noop, i) for i in range(calls)]
        for future in futures:
            ctx.get(future, timeout_s=120)

    def actor_sync() -> None:
        for i in range(calls):
            ctx.get(actor.call.remote(i), timeout_s=60)

    def actor_pipelined() -> None:
        futures = [actor.call.remote(i) for i in range(calls)]
        for future in futures:
            ctx.get(future, timeout_s=120)

    return {
        "run_get_sync_per_s": rate(calls, tasks_sync),
        "run_get_pipelined_per_s": rate(calls, tasks_pipelined),
        "actor_sync_per_s": rate(calls, actor_sync),
        "actor_pipelined_per_s": rate(calls, actor_pipelined),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    calls = args.calls
    result: dict[str, Any] = {"calls": calls}
    result["multiprocessing_pipe_per_s"] = measure_pipe(calls)
    result.update({f"{k}_per_s": v for k, v in measure_workers(calls).items()})
    with tempfile.TemporaryDirectory() as tmp, served_node(Path(tmp)) as node:
        ctx = ShoalContext(
            node.url,
            config_file=str(node.config_file),
            workers_per_node=2,
            env={"PYTHONPATH": str(ROOT)},
        )
        try:
            result["shoal"] = measure_context(ctx, calls)
        finally:
            ctx.close()
    if not args.no_ray:
        from node.tasks.ray_backend import RayContext

        ray_ctx = RayContext(
            init_kwargs={
                "num_cpus": 2,
                "include_dashboard": False,
                "log_to_driver": False,
                "runtime_env": {"env_vars": {"PYTHONPATH": str(ROOT)}},
            }
        )
        try:
            result["ray"] = measure_context(ray_ctx, calls)
        finally:
            ray_ctx.close()
    shoal = result["shoal"]
    result["targets"] = {
        "shoal_actor_sync_ge_500": shoal["actor_sync_per_s"] >= 500,
        "shoal_actor_pipelined_ge_2000": shoal["actor_pipelined_per_s"] >= 2000,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
