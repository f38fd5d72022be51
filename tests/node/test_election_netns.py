"""The election across real hosts: five voting `shoal serve` daemons in network namespaces, the
cluster secret set, a probe on a sixth host polling every daemon's GET /v1/plan.

Crash of the coordinator and a 2|3 partition run with the default timeouts; the randomized
schedule of partitions, pauses, kills and restarts runs with FAST_TIMEOUTS (config file) and
checks every node's adoption log. Each test starts a fresh cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from config import Timeouts
from tests.cluster import NetnsClusterFactory
from tests.node.election_netns_swarm import (
    START_S,
    ElectionWatch,
    adoption_problems,
    agreed,
    converged,
    coordinator_of,
    read_logs,
    start_voters,
)
from tests.node.netns_swarm import Swarm

pytestmark = pytest.mark.netns
RecordProperty = Callable[[str, object], None]

VOTERS = 5
DEFAULTS = Timeouts()
DETECTION_S = DEFAULTS.lease_s + DEFAULTS.election_max_s
"""Worst case from a crash to a survivor standing: the lease it still honours, then the
longest election timeout (default timeouts)."""
FAILOVER_BOUND_S = DETECTION_S + 2.0
CHAOS_ROUNDS = 24
CHAOS_SEED_ENV = "SHOAL_CHAOS_SEED"


def _start(
    netns_cluster: NetnsClusterFactory, timeouts: dict[str, float] | None = None
) -> tuple[Swarm, ElectionWatch]:
    """Five voters electing a coordinator with a plan everywhere."""
    cluster = netns_cluster(VOTERS + 1)
    swarm, watch = start_voters(cluster, VOTERS, timeouts=timeouts)
    watch.wait(
        converged(swarm.names), since=0.0, timeout_s=START_S, message="a first coordinator + plan"
    )
    return swarm, watch


def _check_logs(swarm: Swarm, context: str = "") -> None:
    logs = read_logs(swarm.hosts)
    assert any(logs.values()), "no adoption log was written"
    problems = adoption_problems(logs, swarm.names)
    assert not problems, f"{context}adoption log violations:\n" + "\n".join(problems)


def test_coordinator_crash_fails_over_within_detection(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    swarm, watch = _start(netns_cluster)
    found = coordinator_of(watch.latest, swarm.names)
    assert found is not None
    leader, term = found
    survivors = swarm.others(leader)
    killed_at = time.monotonic()
    swarm.kill(leader)
    new_at = watch.wait(
        agreed(survivors, above_term=term, not_coordinator=leader),
        since=killed_at,
        timeout_s=FAILOVER_BOUND_S + 10.0,
        message=f"a coordinator other than {leader} in a term above {term}",
    )
    elapsed = new_at - killed_at
    record_property("failover_s", round(elapsed, 3))
    new_leader, new_term = coordinator_of(watch.latest, survivors) or ("?", -1)
    print(
        f"SIGKILL of coordinator {leader} (term {term}) -> {new_leader} (term {new_term}) "
        f"agreed by all 4 survivors after {elapsed:.2f} s (bound {FAILOVER_BOUND_S:g} s)"
    )
    assert elapsed <= FAILOVER_BOUND_S, f"failover took {elapsed:.2f} s > {FAILOVER_BOUND_S} s"
    _check_logs(swarm)
