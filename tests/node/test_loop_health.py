"""The election loop reports its failing steps (a store that keeps failing) to its LoopHealth:
the `election` health component is degraded with the last error, healthy again after."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from config import Role
from health import HealthChecker, HealthStatus
from node.election.elector import Elector
from node.election.roles import NodeCapabilities, RolePolicy
from node.election.seams import InMemoryDurableState, InMemoryElectionNetwork
from node.election.state import ElectionConfig

FAST = {"heartbeat_interval_s": 0.03, "lease_s": 0.25, "election_min_s": 0.1, "election_max_s": 0.2}


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


class BrokenStore(InMemoryDurableState):
    """A durable store whose writes fail while `broken` (a WAL that is unavailable)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    async def set(self, key: str, value: Any) -> None:
        if self.broken:
            raise OSError("database is locked")
        await super().set(key, value)


async def test_the_election_loop_reports_a_store_that_keeps_failing() -> None:
    store = BrokenStore()
    member = NodeCapabilities("solo", "10.0.0.1", 1, "L4", 24.0, Role.AUTO)
    elector = Elector(
        ElectionConfig("solo", ("solo",), **FAST),
        InMemoryElectionNetwork().transport("solo"),
        store,
        capabilities=lambda: [member],
        policy=RolePolicy(min_training=1, max_training=1, master_port=29400),
        rng=random.Random(7),
    )
    checker = HealthChecker()
    async with elector:
        checker.add_check("election", elector.loop_health.check)
        await eventually(lambda: elector.loop_health.failing)
        component = await checker.run_check("election")
        assert component.status is HealthStatus.DEGRADED
        assert "database is locked" in component.message
        store.broken = False
        await eventually(lambda: elector.plan is not None)
        await eventually(lambda: elector.loop_health.consecutive_failures == 0)
        assert (await checker.run_check("election")).status is HealthStatus.HEALTHY
