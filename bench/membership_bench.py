"""Failure detection at scale: the real membership code over InMemoryNetwork with default timing.

Prints one JSON document. For 1000 and 100 members: time until every live member knows of a
crash (all marked it dead), and bytes sent per node per second (steady state, and the window of
the crash); `join` grows a cluster through one seed instead of a warm start and adds the time
until all know all. For 8 members: kill-to-dead at every peer over several crashes (median, max).
Targets: all know of a death <= 8 s at 1000; <= 5 KB/s per node; 8 members median <= 2.5 s,
max <= 5 s. Runs on a fast-forwarded event loop (virtual time: timers fire in order without
waiting, so results do not depend on this machine's load); `--real` runs in real time instead,
and `steady_cpu_per_sim_s` (CPU seconds per simulated second once settled) says whether one
real event loop keeps up (below 1.0).
With --netns (root) it also runs part (a) and (c) with real daemons: bench/membership_netns.py.
Usage: python bench/membership_bench.py [--sizes 1000,100] [--trials 12] [--real] [--netns]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import random
import selectors
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from config import Timeouts  # noqa: E402
from node import EventKind, InMemoryNetwork, Member, MemberEvent, Membership, MemberState  # noqa: E402

PORT = 8770
SECRET = b"bench-cluster-secret-0123456789abcdef"
META: dict[str, Any] = {
    "version": "0.1.0",
    "role": "training",
    "cluster": "lab",
    "gpu_count": 8,
    "gpu_vram_gb": 80,
    "gpu": "NVIDIA H100 80GB HBM3",
    "config_hash": "3f9a1c27be0d",
}


class _FastForwardSelector:
    """Wraps a real selector: polls it, and when nothing is ready jumps the loop's clock to the
    next timer instead of sleeping."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        events = self._real.select(0)
        if not events and timeout:
            self._loop.now += timeout
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose time advances only when it would otherwise sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        super().__init__(selector=_FastForwardSelector(self))  # type: ignore[arg-type]

    def time(self) -> float:
        return self.now


def address_of(index: int) -> str:
    return f"10.{index // 62500}.{index // 250 % 250}.{index % 250 + 1}"


async def build(size: int, seed: int, *, warm: bool) -> tuple[InMemoryNetwork, list[Membership]]:
    loop = asyncio.get_running_loop()
    network = InMemoryNetwork(random.Random(seed), delay_s=0.0005, jitter_s=0.001)
    nodes = []
    for index in range(size):
        endpoint = network.endpoint(address_of(index), PORT, cluster="lab", secret=SECRET)
        nodes.append(
            Membership(
                f"node-{index:04d}",
                address_of(index),
                PORT,
                META,
                endpoint,
                Timeouts(),
                cluster="lab",
                rng=random.Random(seed * 100_003 + index),
                clock=loop.time,
            )
        )
    if warm:
        now = loop.time()
        known = [
            Member(node.self_id, address_of(i), PORT, MemberState.ALIVE, 0, META, now)
            for i, node in enumerate(nodes)
        ]
        for node in nodes:
            node.preload(known)
    for node in nodes:
        await node.start()
    if not warm:
        for node in nodes[1:]:
            node.add_candidate(address_of(0), PORT)
    return network, nodes


def watch_for_death(victim: Membership, peers: list[Membership]) -> dict[str, float]:
    """A dict that fills with peer id -> loop time at which that peer marked `victim` dead."""
    loop = asyncio.get_running_loop()
    dead_at: dict[str, float] = {}
    for peer in peers:

        def on_event(event: MemberEvent, name: str = peer.self_id) -> None:
            if event.kind == EventKind.DEAD and event.member.node_id == victim.self_id:
                dead_at.setdefault(name, loop.time())

        peer.add_listener(on_event)
    return dead_at


async def crash_run(size: int, seed: int, *, warm_s: float, warm: bool = True) -> dict[str, Any]:
    """Start `size` members, let them settle, crash one, time how long until all know."""
    loop = asyncio.get_running_loop()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    network, nodes = await build(size, seed, warm=warm)
    start = loop.time()
    join_s = None
    if not warm:
        while any(node.counts()["alive"] < size for node in nodes):
            await asyncio.sleep(0.1)
            if loop.time() - start > 120:
                break
        join_s = round(loop.time() - start, 2)
    gc.collect()
    gc.freeze()
    await asyncio.sleep(warm_s)
    steady_from, steady_bytes = loop.time(), network.total_bytes_sent()
    steady_cpu = time.process_time()
    await asyncio.sleep(10.0)
    steady_s = loop.time() - steady_from
    steady_rate = (network.total_bytes_sent() - steady_bytes) / steady_s / size
    steady_cpu = (time.process_time() - steady_cpu) / steady_s
    false_suspicions = sum(node.counts()["suspect"] + node.counts()["dead"] for node in nodes)
    loop_stalls = sum(node.stall_count for node in nodes)
    unhealthy = sum(1 for node in nodes if node.local_health > 0)

    victim = nodes[random.Random(seed).randrange(size)]
    peers = [node for node in nodes if node is not victim]
    dead_at = watch_for_death(victim, peers)
    killed_at, bytes_at_kill = loop.time(), network.total_bytes_sent()
    network.isolate(victim.member(victim.self_id).address)  # type: ignore[union-attr]
    await victim.close()
    while len(dead_at) < len(peers) and loop.time() - killed_at < 60:
        await asyncio.sleep(0.05)
    await asyncio.sleep(2.0)
    event_rate = (network.total_bytes_sent() - bytes_at_kill) / (loop.time() - killed_at) / size
    sim_s = loop.time() - start
    for node in nodes:
        await node.close()
    network.close()
    gc.unfreeze()
    times = sorted(t - killed_at for t in dead_at.values())
    result = {
        "members": size,
        "all_know_dead_s": round(times[-1], 3) if len(times) == len(peers) else None,
        "first_dead_s": round(times[0], 3) if times else None,
        "median_dead_s": round(statistics.median(times), 3) if times else None,
        "peers_knowing": len(times),
        "bytes_per_node_per_s_steady": round(steady_rate),
        "bytes_per_node_per_s_crash_window": round(event_rate),
        "false_suspect_or_dead_before_crash": false_suspicions,
        "loop_stalls_seen_before_crash": loop_stalls,
        "members_with_local_health_above_0": unhealthy,
        "sim_s": round(sim_s, 1),
        "wall_s": round(time.perf_counter() - wall0, 1),
        "cpu_per_sim_s": round((time.process_time() - cpu0) / sim_s, 3),
        "steady_cpu_per_sim_s": round(steady_cpu, 3),
    }
    if join_s is not None:
        result["join_all_know_all_s"] = join_s
    return result


async def kill_to_dead(size: int, trials: int, seed: int) -> dict[str, Any]:
    """Crash one of `size` members `trials` times; kill-to-dead at every peer."""
    loop = asyncio.get_running_loop()
    samples: list[float] = []
    for trial in range(trials):
        network, nodes = await build(size, seed + trial, warm=False)
        await asyncio.sleep(5.0 + trial * 0.137)
        victim = nodes[trial % size]
        killed_at = loop.time()
        dead_at = watch_for_death(victim, [node for node in nodes if node is not victim])
        network.isolate(victim.member(victim.self_id).address)  # type: ignore[union-attr]
        await victim.close()
        while len(dead_at) < size - 1 and loop.time() - killed_at < 30:
            await asyncio.sleep(0.01)
        samples += [t - killed_at for t in dead_at.values()]
        for node in nodes:
            await node.close()
        network.close()
    return {
        "members": size,
        "crashes": trials,
        "observations": len(samples),
        "expected_observations": trials * (size - 1),
        "kill_to_dead_median_s": round(statistics.median(samples), 3),
        "kill_to_dead_p90_s": round(statistics.quantiles(samples, n=10)[-1], 3),
        "kill_to_dead_max_s": round(max(samples), 3),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    out: dict[str, Any] = {
        "clock": "real" if args.real else "virtual (fast-forwarded event loop)",
        "timeouts": Timeouts().model_dump(
            include={
                "probe_interval_s",
                "probe_timeout_s",
                "indirect_probe_timeout_s",
                "suspicion_s",
                "dead_reap_s",
            }
        ),
        "network": "in-memory, 0.5-1.5 ms one-way delay, signed datagrams (HMAC-SHA256)",
    }
    out["crash"] = [await crash_run(size, 7, warm_s=args.warm_s) for size in sizes]
    if args.join:
        out["join"] = await crash_run(args.join, 11, warm_s=args.warm_s, warm=False)
    out["eight_members"] = await kill_to_dead(8, args.trials, 3)
    return out


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,100")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--warm-s", type=float, default=10.0)
    parser.add_argument("--join", type=int, default=100, help="also grow a cluster by joins")
    parser.add_argument("--real", action="store_true", help="real time instead of virtual")
    parser.add_argument(
        "--netns",
        action="store_true",
        help="also run 8 real daemons in network namespaces (root): kill-to-dead over 10 kills, "
        "idle RSS and CPU (bench/membership_netns.py)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.real:
        result = asyncio.run(main(args))
    else:
        loop = VirtualTimeLoop()
        try:
            result = loop.run_until_complete(main(args))
        finally:
            loop.close()
    if args.netns:
        from bench import membership_netns

        result = {"simulation": result, "netns": membership_netns.run()}
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    run()
