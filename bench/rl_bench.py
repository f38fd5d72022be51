"""Pipeline-RL data plane speed, each number beside its baseline from the same run.

1. Weights digest speed (GB/s) of shoal-pws64-v1 beside the previous release's sha256 (on
   every core), over the same tensors on --device (cpu by default; cuda on a GPU host).
2. Publishing a float32 model to 2 receivers over gloo on loopback (WeightPublisher with the
   --digest algo, shoal-pws64-v1 by default: HTTP handshake through three daemons' weights
   planes, ready keys, bucketed broadcast, digest checks, acknowledgements, the applied report
   and its WAL record in the trainer node's durable WAL) vs a bare `broadcast` of the same
   tensors, one collective per tensor, in 3 processes. The issue's figure is 100M parameters;
   this 2-core machine uses 10M by default (--params).
3. Rollouts consumed per second through RolloutStream from a real daemon's rollouts store.
Prints one JSON document. Usage: python bench/rl_bench.py [--params 10000000] [--rounds 5]
[--rollouts 50000] [--digest shoal-pws64-v1|sha256] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)

import torch  # noqa: E402
from aiohttp import ClientSession, web  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from config import Role, load_settings  # noqa: E402
from node.daemon import NodeDaemon  # noqa: E402
from node.plan import GroupSpec, RolePlan  # noqa: E402
from node.rl.broadcast import torch_distributed  # noqa: E402
from node.rl.digest import (  # noqa: E402
    ALGOS,
    PWS_ALGO,
    SHA256_ALGO,
    HostStaging,
    digest_named,
    hash_pool,
)
from node.rl.group import weights_port  # noqa: E402
from node.rl.publisher import WeightPublisher  # noqa: E402
from node.rl.receiver import WeightReceiver  # noqa: E402
from node.rl.routes import WeightsRoutes  # noqa: E402
from node.rl.service import WeightsService  # noqa: E402
from node.rl.stream import RolloutStream  # noqa: E402
from wal import WriteAheadLog  # noqa: E402

RUN = "bench"
dist = torch_distributed()
TENSORS = 20


def model(params: int, *, device: str = "cpu", dtype: str = "float32") -> torch.nn.Module:
    """`params` parameters of `dtype` on `device` in TENSORS tensors of equal size."""
    torch.manual_seed(0)
    kind = getattr(torch, dtype)
    net = torch.nn.ParameterList(
        [
            torch.nn.Parameter(torch.randn(params // TENSORS).to(device=device, dtype=kind))
            for _ in range(TENSORS)
        ]
    )
    return net


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CONTROL_PHASES = ("offer", "ready", "ack", "record")
"""The phases of a publish that are the handshake, acknowledgements and WAL record (the
issue's overhead); `prepare` is the trainer's digest of the weights, and the broadcast phase
grows beyond the bare one by the receivers' digests beside the collective."""


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def bare_rank(rank: int, port: int, params: int, rounds: int, device: str, dtype: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, timeout=timedelta(seconds=120))
    group = dist.ProcessGroupGloo(dist.PrefixStore("bare", store), rank, 3, timedelta(seconds=120))
    tensors = [p.data for p in model(params, device=device, dtype=dtype).parameters()]
    times = []
    for _ in range(rounds + 1):
        group.barrier().wait()
        started = time.perf_counter()
        for tensor in tensors:
            group.broadcast([tensor], dist.BroadcastOptions()).wait()
        group.barrier().wait()  # the receivers have everything
        times.append(time.perf_counter() - started)
    if rank == 0:
        print(json.dumps(times[1:]))


def receiver_main(url: str, params: int, rounds: int, device: str, dtype: str) -> None:
    net = model(params, device=device, dtype=dtype)
    receiver = WeightReceiver(RUN, url)
    got = 0
    while got < rounds + 1:
        if receiver.receive_into(net, timeout_s=60) is not None:
            got += 1


def bench_bare(
    params: int, rounds: int, *, device: str = "cpu", dtype: str = "float32"
) -> list[float]:
    """Per-round seconds of a bare per-tensor gloo broadcast from rank 0 to 2 receivers."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--bare-rank",
                str(r),
                "--port",
                str(port),
                "--params",
                str(params),
                "--rounds",
                str(rounds),
                "--device",
                device,
                "--dtype",
                dtype,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(3)
    ]
    out = [p.communicate(timeout=600)[0] for p in procs]
    return list(json.loads(out[0]))


def bench_digest(params: int, rounds: int, device: str) -> dict[str, dict[str, float]]:
    """GB/s of each digest algo over the bench model's tensors on `device` (median of
    `rounds` after one warm-up; one pool and one pinned buffer for all, as a publisher)."""
    named = [(name, p.detach().to(device)) for name, p in model(params).named_parameters()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    staging = HostStaging()
    found: dict[str, dict[str, float]] = {}
    with hash_pool() as pool:
        for algo in (PWS_ALGO, SHA256_ALGO):
            times = []
            for _ in range(rounds + 1):
                started = time.perf_counter()
                digest_named(named, algo, pool=pool, staging=staging)
                times.append(time.perf_counter() - started)
            median = statistics.median(times[1:])
            found[algo] = {"gb_per_s": round(nbytes / median / 1e9, 3), "median_s": median}
    return found


def bench_publish(
    params: int,
    rounds: int,
    phases: list[dict[str, float]],
    algo: str = "auto",
    *,
    device: str = "cpu",
    dtype: str = "float32",
) -> list[float]:
    """Per-round seconds of shoal's publish (digest, offer, broadcast, acks, WAL record) of the
    same tensors to 2 receivers; `phases` gets each round's phase split."""
    port = free_port()
    plan = RolePlan(
        term=1,
        version=1,
        roles={"t": Role.TRAINING, "a": Role.INFERENCE, "b": Role.INFERENCE},
        training_ranks=("t",),
        group=GroupSpec("127.0.0.1", port - weights_port(0, RUN), 1, "gloo"),
    )
    urls: dict[str, str] = {}
    loop = asyncio.new_event_loop()
    started = threading.Event()

    wal_dir = tempfile.TemporaryDirectory(prefix="rl-bench-wal-")
    wal = WriteAheadLog(Path(wal_dir.name) / "wal.db")

    async def serve() -> None:
        await wal.open()
        for node in ("t", "a", "b"):
            service = WeightsService(
                node,
                lambda: plan,
                urls.get,
                wal=wal if node == "t" else None,
                registry=CollectorRegistry(),
            )
            app = web.Application()
            app.add_routes(WeightsRoutes(service).routes())
            app.router.add_get("/v1/rendezvous", WeightsRoutes(service).rendezvous)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            urls[node] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        started.set()

    threading.Thread(target=loop.run_forever, daemon=True).start()
    asyncio.run_coroutine_threadsafe(serve(), loop)
    started.wait(30)
    receivers = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--receiver",
                urls[node],
                "--params",
                str(params),
                "--rounds",
                str(rounds),
                "--device",
                device,
                "--dtype",
                dtype,
            ],
        )
        for node in ("a", "b")
    ]
    net = model(params, device=device, dtype=dtype)
    times: list[float] = []
    with WeightPublisher(RUN, urls["t"], deadline_s=120, join_s=60, digest_algo=algo) as publisher:
        for version in range(rounds + 1):
            result = publisher.publish(net, version)
            assert result.acknowledged == ("a", "b"), result
            times.append(result.total_s)
            phases.append({k: round(v, 4) for k, v in result.phases_s.items()})
    for proc in receivers:
        proc.wait(60)
    asyncio.run_coroutine_threadsafe(wal.close(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    wal_dir.cleanup()
    return times[1:]


async def bench_stream(rollouts: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        flags = {"data_dir": Path(tmp), "node_id": "bench", "port": 0, "mdns": False}
        settings = load_settings(env={}, flags=flags).settings
        async with NodeDaemon(settings) as daemon, ClientSession() as s:
            url = f"http://127.0.0.1:{daemon.port}"
            for start in range(0, rollouts, 5000):
                batch = [
                    {
                        "sample_id": f"s{i:08d}",
                        "created_at": float(i),
                        "model_version": i // 1000,
                        "run": RUN,
                        "payload": {"obs": [i, i + 1], "reward": 0.5},
                    }
                    for i in range(start, min(rollouts, start + 5000))
                ]
                async with s.post(f"{url}/v1/records/rollouts", json=batch) as response:
                    assert response.status == 200, await response.text()
            stream = RolloutStream(RUN, max_lag=10**6, batch_size=1000, nodes=[url])

            def consume() -> float:
                began = time.perf_counter()
                total = 0
                while total < rollouts:
                    total += len(stream.next_batch(rollouts // 1000, timeout_s=5))
                return total / (time.perf_counter() - began)

            return await asyncio.to_thread(consume)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rollouts", type=int, default=50_000)
    parser.add_argument("--bare-rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--receiver")
    parser.add_argument("--digest", choices=(*ALGOS, "auto"), default=PWS_ALGO)
    parser.add_argument("--device", default="cpu", help="where the weights live: cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    if args.bare_rank is not None:
        bare_rank(args.bare_rank, args.port, args.params, args.rounds, args.device, args.dtype)
        return
    if args.receiver is not None:
        receiver_main(args.receiver, args.params, args.rounds, args.device, args.dtype)
        return
    digests = bench_digest(args.params, args.rounds, args.device)
    bare = bench_bare(args.params, args.rounds, device=args.device, dtype=args.dtype)
    phases: list[dict[str, float]] = []
    published = bench_publish(
        args.params, args.rounds, phases, args.digest, device=args.device, dtype=args.dtype
    )
    rate = asyncio.run(bench_stream(args.rollouts))
    overhead = [p - b for p, b in zip(sorted(published), sorted(bare), strict=True)]
    rounds = phases[1:]  # the first round also forms the group
    bare_median = statistics.median(bare)
    control = [sum(r[name] for name in CONTROL_PHASES) for r in rounds]
    print(
        json.dumps(
            {
                "params": args.params,
                "bytes": args.params * (2 if args.dtype == "bfloat16" else 4),
                "dtype": args.dtype,
                "receivers": 2,
                "digest_device": args.device,
                "digest": digests,
                "publish_digest": args.digest,
                "publish_s": {"median": statistics.median(published), "p99": p99(published)},
                "bare_broadcast_s": {"median": statistics.median(bare), "p99": p99(bare)},
                "overhead_ratio": statistics.median(published) / bare_median - 1,
                "overhead_p99_ms": p99(overhead) * 1000,
                "overhead_split_ms": {
                    "control_plane_p99": _ms(p99(control)),
                    "control_plane_median": _ms(statistics.median(control)),
                    "trainer_digest_median": _ms(statistics.median(r["prepare"] for r in rounds)),
                    "broadcast_beyond_bare_median": _ms(
                        statistics.median(r["broadcast"] for r in rounds) - bare_median
                    ),
                },
                "rollouts_consumed_per_s": round(rate),
                "samples": {"publish_s": published, "bare_s": bare, "publish_phases_s": phases[1:]},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
