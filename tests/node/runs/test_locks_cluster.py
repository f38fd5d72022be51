"""Cluster locks on real daemons on 127.0.0.1: any node forwards to the coordinator, FIFO
hand-over, stale fences refused, and mutual exclusion across coordinator failovers checked over
the holders' own logs."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from node.daemon import NodeDaemon
from node.errors import LockLostError, LockUnavailableError
from node.locks import LockFence, cluster_lock
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.runs.cluster import NAMES, post, running, until

FAILOVERS = int(os.environ.get("SHOAL_LOCK_FAILOVERS", "4"))


async def waiter_expiries(listing_url: str) -> dict[str, float]:
    """The waiters of lock `train` and when each one's wait ends, from a lock listing."""
    async with aiohttp.ClientSession() as session, session.get(listing_url) as response:
        listing = await response.json()
    return {w["holder"]: float(w["expires_at"]) for w in listing["locks"]["train"]["waiters"]}


async def test_any_node_serves_locks_fifo_and_refuses_a_stale_fence(tmp_path: Path) -> None:
    async with running(tmp_path) as cluster:
        coordinator = await cluster.elected()
        other = next(n for n in NAMES if n != coordinator)
        via = f"http://127.0.0.1:{cluster.ports[other]}/v1/locks/train"
        status, first = await post(f"{via}/acquire", {"holder": "a", "ttl_s": 30})
        assert status == 200
        assert first["granted"]
        assert first["position"] == 0
        queued = []
        for holder in ("b", "c"):
            status, answer = await post(
                f"{via}/acquire", {"holder": holder, "ttl_s": 30, "wait": True, "wait_s": 0.1}
            )
            queued.append(answer["position"])
        assert queued == [1, 2]
        status, answer = await post(f"{via}/renew", {"holder": "a", "fence": [0, 1]})
        assert status == 409
        assert answer["error"] == "stale_lock_fence"
        listing_url = f"http://127.0.0.1:{cluster.ports[other]}/v1/locks"
        queued_until = (await waiter_expiries(listing_url))["b"]
        waiting = asyncio.create_task(
            post(f"{via}/acquire", {"holder": "b", "ttl_s": 30, "wait": True, "wait_s": 10})
        )

        async def b_waits() -> bool:
            # b's new ask moved its wait's end: the coordinator stored it and holds the request
            return (await waiter_expiries(listing_url))["b"] > queued_until

        await until(b_waits, 10, "the coordinator to hold b's waiting acquire")
        released_at = time.monotonic()
        status, _ = await post(f"{via}/release", {"holder": "a", "fence": first["fence"]})
        assert status == 200
        status, granted = await waiting
        handed_over_s = time.monotonic() - released_at
        assert granted["granted"]
        assert LockFence.parse(granted["fence"]) > LockFence.parse(first["fence"])
        assert handed_over_s < 5.0  # liveness only; the bench measures the hand-over time
        async with aiohttp.ClientSession() as session, session.get(listing_url) as r:
            listing = await r.json()
        assert listing["locks"]["train"]["holder"] == "b"
        assert [w["holder"] for w in listing["locks"]["train"]["waiters"]] == ["c"]


async def test_a_lock_whose_holder_stops_renewing_passes_on_under_a_larger_fence(
    tmp_path: Path,
) -> None:
    settings = test_settings(tmp_path, "solo", **FAST_ELECTION)
    async with NodeDaemon(settings) as daemon:
        via = f"http://127.0.0.1:{daemon.port}/v1/locks/train"
        first: dict[str, object] = {}

        async def granted_to_a() -> bool:
            status, answer = await post(f"{via}/acquire", {"holder": "a", "ttl_s": 3})
            first.update(answer)
            return status == 200 and bool(answer["granted"])

        await until(granted_to_a, 10, "the lone node to grant the lock to a")
        status, queued = await post(
            f"{via}/acquire", {"holder": "b", "ttl_s": 30, "wait": True, "wait_s": 0.1}
        )
        assert (status, queued["position"]) == (200, 1), queued
        # a never renews: its lease runs out and the expiry loop hands the lock to b
        status, granted = await post(
            f"{via}/acquire", {"holder": "b", "ttl_s": 30, "wait": True, "wait_s": 20}
        )
        assert status == 200
        assert granted["granted"], granted
        assert LockFence.parse(granted["fence"]) > LockFence.parse(first["fence"])
        status, refused = await post(f"{via}/renew", {"holder": "a", "fence": first["fence"]})
        assert (status, refused["error"]) == (409, "not_holder")


@dataclass(frozen=True)
class Hold:
    holder: str
    fence: LockFence
    start: float
    end: float


async def test_never_two_holders_across_coordinator_failovers(tmp_path: Path) -> None:
    rng = random.Random(18)
    holds: list[Hold] = []
    lost: list[str] = []
    stop = asyncio.Event()
    async with running(tmp_path) as cluster:
        urls = cluster.urls

        async def client(index: int) -> None:
            turn = 0
            while not stop.is_set():
                turn += 1
                holder = f"c{index}.{turn}"
                try:
                    async with cluster_lock(
                        "train", holder=holder, ttl_s=2.0, urls=urls, wait_s=1.0
                    ) as fence:
                        start = time.monotonic()
                        try:
                            await asyncio.sleep(rng.uniform(0.05, 3.0))  # may span a failover
                        finally:
                            holds.append(Hold(holder, fence, start, time.monotonic()))
                except (LockLostError, LockUnavailableError) as exc:
                    lost.append(f"{holder}: {exc}")

        clients = [asyncio.create_task(client(i)) for i in range(4)]
        try:
            for _ in range(FAILOVERS):
                await asyncio.sleep(rng.uniform(0.3, 1.0))
                victim = await cluster.elected()
                await cluster.stop(victim)
                await cluster.elected()
                before = len(holds)

                async def granted_again(before: int = before) -> bool:
                    return len(holds) > before

                await until(granted_again, 30, "a grant under the new coordinator")
                await cluster.start(victim)
            await asyncio.sleep(0.5)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*clients), 60)
    holds.sort(key=lambda h: h.start)
    assert len(holds) > FAILOVERS
    for earlier, later in itertools.pairwise(holds):
        assert earlier.end <= later.start, f"two holders at once: {earlier} and {later}"
        assert earlier.fence < later.fence, f"fence did not increase: {earlier} then {later}"


async def test_a_holder_that_cannot_renew_stops_acting(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, "solo", **FAST_ELECTION)
    completed = False
    async with NodeDaemon(settings) as daemon:
        url = f"http://127.0.0.1:{daemon.port}"

        async def coordinating() -> bool:
            status, _ = await post(f"{url}/v1/locks/probe/acquire", {"holder": "p", "ttl_s": 1})
            return status == 200

        await until(coordinating, 10, "the lone node to serve locks")

        async def hold() -> None:
            nonlocal completed
            async with cluster_lock("train", holder="h", ttl_s=1.0, urls=[url]):
                await daemon.close()  # no renewal can reach a coordinator any more
                await asyncio.sleep(20)
                completed = True

        with pytest.raises(LockLostError):
            await hold()
    assert not completed
