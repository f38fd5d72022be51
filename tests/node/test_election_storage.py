"""Never act on state that was not stored: with WAL writes failing at random during elections,
no node shows, votes, campaigns, leads or applies a plan on a term or plan it could not store;
it steps down to what is stored, says why, retries, and one coordinator per term still holds."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from node.daemon import NodeDaemon
from node.election.elector import PLAN_KEY, VOTE_KEY
from node.election.messages import Heartbeat
from node.election.seams import InMemoryDurableState, InMemoryElectionNetwork
from node.election.state import ElectionRole
from tests.node.daemons import test_settings
from tests.node.test_election_async import Cluster

VOTERS = ("a", "b", "c")
CHAOS_S = 3.0
SETTLE_LIVENESS_S = 20.0


class RandomlyFailingDurable(InMemoryDurableState):
    """A WAL whose writes fail with probability `rate` (a full or failing disk)."""

    def __init__(self, rng: random.Random, rate: float) -> None:
        super().__init__()
        self.rng = rng
        self.rate = rate
        self.failed = 0

    async def set(self, key: str, value: Any) -> None:
        if self.rng.random() < self.rate:
            self.failed += 1
            raise OSError(28, "No space left on device")
        await super().set(key, value)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    made = Cluster(VOTERS, InMemoryElectionNetwork(random.Random(3)), tmp_path)
    yield made
    await made.close()


def _unstored(cluster: Cluster) -> list[str]:
    """What any node shows or applies beyond what its store holds."""
    problems = []
    for node, elector in cluster.electors.items():
        durable = cluster.durables[node]
        stored = durable.values.get(VOTE_KEY)
        stored_term = 0 if stored is None else int(json.loads(stored)["term"])
        status = elector.status
        if status.term != stored_term:
            problems.append(f"{node} shows term {status.term}, stored {stored_term}")
        if status.role is ElectionRole.COORDINATOR and status.term > stored_term:
            problems.append(f"{node} leads term {status.term} it did not store")
        plan = elector.plan
        stored_plan = durable.values.get(PLAN_KEY)
        if plan is not None and stored_plan is None:
            problems.append(f"{node} applies plan {plan.fence} it did not store")
    return problems


async def test_wal_write_failures_never_let_a_node_act_on_unstored_state(
    cluster: Cluster,
) -> None:
    rng = random.Random(11)
    durables = {node: RandomlyFailingDurable(rng, 0.35) for node in VOTERS}
    cluster.durables.update(durables)
    for node in VOTERS:
        await cluster.start(node)
    problems: list[str] = []
    said_why: set[str] = set()
    deadline = time.monotonic() + CHAOS_S
    next_crash = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        problems += _unstored(cluster)
        for node, elector in cluster.electors.items():
            if elector.storage_problem and "No space left" in elector.storage_problem:
                said_why.add(node)
        if time.monotonic() >= next_crash:  # restart the leader (or anyone): new elections
            leaders = cluster.leaders() or [rng.choice(VOTERS)]
            await cluster.crash(leaders[0])
            await cluster.start(leaders[0])
            next_crash = time.monotonic() + 0.3
        await asyncio.sleep(0.002)
    assert problems == [], problems[:5]
    assert sum(d.failed for d in durables.values()) >= 5  # the chaos really happened
    assert said_why, "a node that could not store its state says why"
    assert all(len(names) == 1 for names in cluster.coordinators_by_term().values()), (
        cluster.coordinators_by_term()
    )
    # space returns: the nodes retry by themselves and settle on one coordinator with a plan
    for durable in durables.values():
        durable.rate = 0.0
    deadline = time.monotonic() + SETTLE_LIVENESS_S
    while not cluster.settled():
        assert time.monotonic() < deadline, "no coordinator after storage recovered"
        await asyncio.sleep(0.02)
    assert _unstored(cluster) == []
    assert all(e.storage_problem is None for e in cluster.electors.values() if e.plan)
    assert all(len(names) == 1 for names in cluster.coordinators_by_term().values())
    assert cluster.check_logs() == []


async def test_a_node_that_cannot_store_never_campaigns_and_health_says_why(
    cluster: Cluster,
) -> None:
    for node in VOTERS:
        cluster.durables[node] = RandomlyFailingDurable(random.Random(1), 0.0)
        await cluster.start(node)
    deadline = time.monotonic() + SETTLE_LIVENESS_S
    while not cluster.settled():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    (leader,) = cluster.leaders()
    full = next(node for node in VOTERS if node != leader)
    durable = cluster.durables[full]
    assert isinstance(durable, RandomlyFailingDurable)
    durable.rate = 1.0  # its disk is now full
    await cluster.crash(leader)  # an election is due; `full` cannot store a term or a vote
    elector = cluster.electors[full]
    deadline = time.monotonic() + SETTLE_LIVENESS_S
    while not elector.loop_health.failing:
        assert time.monotonic() < deadline, "the election health never degraded"
        assert _unstored(cluster) == []
        assert full not in cluster.leaders()
        await asyncio.sleep(0.005)
    assert elector.status.role is ElectionRole.FOLLOWER
    assert elector.storage_problem is not None
    assert "No space left on device" in elector.storage_problem
    assert "No space left on device" in elector.loop_health.result().message
    durable.rate = 0.0  # space returns: it retries by itself
    await cluster.start(leader)
    deadline = time.monotonic() + SETTLE_LIVENESS_S
    while not cluster.settled():
        assert time.monotonic() < deadline, "no coordinator after space returned"
        await asyncio.sleep(0.02)
    assert elector.storage_problem is None


async def test_status_and_health_of_a_daemon_say_why_the_term_cannot_be_stored(
    tmp_path: Path,
) -> None:
    settings = test_settings(tmp_path, "solo", voters=("solo", "other"))
    async with NodeDaemon(settings) as daemon:
        assert daemon.election is not None
        elector = daemon.election.elector
        assert elector is not None

        async def full(key: str, value: Any) -> None:
            raise OSError(28, "No space left on device")

        elector._durable.set = full  # type: ignore[method-assign]
        term = elector.status.term
        with pytest.raises(OSError, match="No space"):  # a heartbeat's new term is not stored
            await elector.handle_heartbeat(Heartbeat(term + 5, "other", 1))
        assert elector.status.term == term  # not acted on: still the stored term
        async with (
            ClientSession() as session,
            session.get(f"http://127.0.0.1:{daemon.port}/v1/status") as response,
        ):
            status = await response.json()
    notes = [note for note in status["notes"] if note.startswith("election: ")]
    assert len(notes) == 1, status["notes"]
    assert "cannot store the election state" in notes[0]
    assert "No space left on device" in notes[0]
    assert status["term"] == term
