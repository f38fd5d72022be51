"""The election across real hosts: five voting `shoal serve` daemons in network namespaces, the
cluster secret set, a probe on a sixth host polling every daemon's GET /v1/plan.

Crash of the coordinator and a 2|3 partition run with the default timeouts; the randomized
schedule of partitions, pauses, kills and restarts runs with FAST_TIMEOUTS (config file) and
checks every node's adoption log. Each test starts a fresh cluster.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from config import Timeouts
from tests.cluster import NetnsClusterFactory
from tests.node.election_netns_swarm import (
    FAST_TIMEOUTS,
    START_S,
    ElectionWatch,
    Fence,
    PlanView,
    Views,
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
"""The design figure for a failover, printed beside the measured one (bench/election_bench.py
measures it; a test on a loaded machine does not assert it)."""
LIVENESS_S = 30.0
"""How long the tests wait for a failover or an election at all."""
SLACK_S = 1.5
"""Allowance on top of a lease for a loaded event loop and the probe's 0.5 s request timeout
(a view is timed when its answer arrives)."""
CHAOS_ROUNDS = 24
CHAOS_SEED_ENV = "SHOAL_CHAOS_SEED"


def _start(
    netns_cluster: NetnsClusterFactory, timeouts: dict[str, float] | None = None
) -> tuple[Swarm, ElectionWatch]:
    """Five voters electing a coordinator with a plan everywhere."""
    cluster = netns_cluster(VOTERS + 1)
    swarm, watch = start_voters(cluster, VOTERS, timeouts=timeouts)
    watch.wait(
        converged(swarm.names),
        since=0.0,
        timeout_s=START_S,
        hold_s=1.0,
        message="a first coordinator and one plan for all 5",
    )
    return swarm, watch


def _check_logs(swarm: Swarm) -> None:
    logs = read_logs(swarm.hosts)
    assert any(logs.values()), "no adoption log was written"
    problems = adoption_problems(logs, swarm.names)
    assert not problems, "adoption log violations:\n" + "\n".join(problems)


def test_coordinator_crash_fails_over_within_detection(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    swarm, watch = _start(netns_cluster)
    found = coordinator_of(watch.matched, swarm.names)
    assert found is not None
    leader, term = found
    survivors = swarm.others(leader)
    killed_at = time.monotonic()
    swarm.kill(leader)
    new_at = watch.wait(
        agreed(survivors, above_term=term, not_coordinator=leader),
        since=killed_at,
        timeout_s=LIVENESS_S,
        message=f"a coordinator other than {leader} in a term above {term}",
    )
    elapsed = new_at - killed_at
    record_property("failover_s", round(elapsed, 3))
    new_leader, new_term = coordinator_of(watch.matched, survivors) or ("?", -1)
    print(
        f"SIGKILL of coordinator {leader} (term {term}) -> {new_leader} (term {new_term}) "
        f"agreed by all 4 survivors after {elapsed:.2f} s (design {FAILOVER_BOUND_S:g} s)"
    )
    _check_logs(swarm)


def test_partition_two_three_minority_has_no_coordinator_and_no_new_plan(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    swarm, watch = _start(netns_cluster)
    leader, term = coordinator_of(watch.matched, swarm.names) or ("?", -1)
    minority = (leader, swarm.others(leader)[0])
    majority = swarm.others(leader)[1:]
    before = {name: watch.matched[name].plan for name in minority}
    cut_at = time.monotonic()
    swarm.cluster.partition([swarm.host(n) for n in minority], [swarm.host(n) for n in majority])
    no_lease_from = cut_at + 2 * DEFAULTS.lease_s + SLACK_S
    seen_minority: list[PlanView] = []

    def minority_holds(view: PlanView) -> None:
        # The coordinator keeps its lease at most lease_s after its last acknowledged round and
        # the follower honours it lease_s after the last heartbeat: 2 lease_s, then none.
        if view.host not in minority or view.t < cut_at or not view.answered:
            return
        seen_minority.append(view)
        assert view.plan == before[view.host], (
            f"{view.host} on the 2 side applied plan {view.plan} (had {before[view.host]})"
        )
        if view.t >= no_lease_from:
            assert not view.lease_valid, f"{view.host} on the 2 side still has a lease: {view}"

    def majority_leads(views: Views) -> bool:
        if not agreed(majority, above_term=term)(views):
            return False
        plans = {views[name].plan for name in majority}
        fence = plans.pop() if len(plans) == 1 else None
        return fence is not None and fence[0] > term

    elected_at = watch.wait(
        majority_leads,
        since=cut_at,
        timeout_s=LIVENESS_S,
        message="the 3 side to elect a coordinator and apply its plan",
        on_view=minority_holds,
    )
    watch.watch_for(max(0.0, no_lease_from + 1.0 - time.monotonic()), minority_holds)
    late = [v for v in seen_minority if v.t >= no_lease_from]
    assert {v.host for v in late} == set(minority), f"no late views of the 2 side: {late}"
    new_leader, new_term = coordinator_of(watch.matched, majority) or ("?", -1)
    newest = watch.matched[majority[0]].plan
    last_terms = {v.host: v.term for v in seen_minority}
    assert last_terms == dict.fromkeys(minority, term), (
        f"the 2 side's terms moved from {term} to {last_terms} (pre-vote should stop that)"
    )

    heal_at = time.monotonic()
    swarm.cluster.heal()
    healed_at = watch.wait(
        converged(swarm.names, at_least=newest, above_term=term),
        since=heal_at,
        timeout_s=30.0,
        hold_s=1.0,
        message="one coordinator and one plan for all 5 after the heal",
    )
    final = coordinator_of(watch.matched, swarm.names)
    record_property("partition_elect_s", round(elected_at - cut_at, 3))
    record_property("heal_converge_s", round(healed_at - heal_at, 3))
    print(
        f"2|3 partition: {minority} lost {leader}'s lease; {majority} elected {new_leader} "
        f"(term {new_term}, plan {newest}) {elected_at - cut_at:.2f} s after the cut; after "
        f"the heal all 5 follow {final} with plan {watch.matched[leader].plan} after "
        f"{healed_at - heal_at:.2f} s"
    )
    _check_logs(swarm)


FAST = Timeouts(**FAST_TIMEOUTS)
PARTITION_SHAPES = ((2, 3), (1, 4), (2, 3), (1, 2, 2))


@dataclass
class Chaos:
    """The randomized schedule's state: what is cut, down or paused, and since when."""

    swarm: Swarm
    watch: ElectionWatch
    rng: random.Random
    seed: int
    groups: tuple[tuple[str, ...], ...] = ()
    paused: set[str] = field(default_factory=set)
    cut_off: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Node -> (monotonic, wall) time since which it is cut off with a minority and running."""
    frozen: dict[str, Fence | None] = field(default_factory=dict)
    windows: list[tuple[str, float, float]] = field(default_factory=list)
    """(node, wall start, wall end) of every stretch a node spent cut off with a minority."""
    history: list[str] = field(default_factory=list)
    terms: set[tuple[int, str]] = field(default_factory=set)
    checked: int = 0
    """Views of nodes cut off with a minority past the lease window (the checks that bit)."""
    published: int = 0
    logged_terms: set[tuple[int, str]] = field(default_factory=set)
    """(term, coordinator) pairs the adoption logs record."""

    @property
    def down(self) -> set[str]:
        return self.swarm.down

    def note(self, what: str) -> None:
        self.history.append(f"{time.monotonic():.2f} {what}")

    def check_view(self, view: PlanView) -> None:
        """A node cut off with a minority loses its lease and applies no plan after it."""
        if not view.answered:
            return
        if view.lease_valid and view.coordinator is not None and view.term is not None:
            self.terms.add((view.term, view.coordinator))
        since = self.cut_off.get(view.host)
        if since is None or view.host in self.paused:
            return
        age = view.t - since[0]
        if age >= FAST.lease_s + SLACK_S:
            fence = self.frozen.setdefault(view.host, view.plan)
            assert view.plan == fence, self.fail(
                f"{view.host}, cut off with a minority {age:.2f} s ago, applied plan "
                f"{view.plan} after {fence}"
            )
        if age >= 2 * FAST.lease_s + SLACK_S:
            self.checked += 1
            assert not view.lease_valid, self.fail(
                f"{view.host}, cut off with a minority {age:.2f} s ago, has a lease: {view}"
            )

    def fail(self, message: str) -> str:
        if CHAOS_SEED_ENV in message:
            return message
        return (
            f"{message}\nchaos seed {self.seed} (rerun with {CHAOS_SEED_ENV}={self.seed}); "
            "schedule:\n  " + "\n  ".join(self.history)
        )

    def _close_window(self, name: str) -> None:
        since = self.cut_off.pop(name, None)
        if since is not None:
            self.windows.append((name, since[1], time.time()))
        self.frozen.pop(name, None)

    def heal(self, *, note: bool = True) -> None:
        for name in list(self.cut_off):
            self._close_window(name)
        self.swarm.cluster.heal()
        if note and self.groups:
            self.note("heal")
        self.groups = ()

    def partition(self) -> None:
        self.heal(note=False)
        names = list(self.swarm.names)
        self.rng.shuffle(names)
        groups, start = [], 0
        for size in self.rng.choice(PARTITION_SHAPES):
            groups.append(tuple(names[start : start + size]))
            start += size
        self.swarm.cluster.partition(*([self.swarm.host(n) for n in g] for g in groups))
        cut = (time.monotonic(), time.time())
        self.groups = tuple(groups)
        self.cut_off = {n: cut for g in groups if len(g) <= VOTERS // 2 for n in g}
        self.note(f"partition {' | '.join(','.join(g) for g in groups)}")

    def kill(self, name: str, what: str = "") -> None:
        self.swarm.kill(name)
        self.note(f"kill {what}{name}")

    def restart(self, name: str) -> None:
        self.swarm.start(self.swarm.host(name))
        self.note(f"restart {name}")

    def pause(self, name: str) -> None:
        self.swarm.daemons[name].stop()
        self.paused.add(name)
        self.note(f"pause {name}")

    def resume_all(self) -> None:
        # A paused node may still hold requests from before the pause: its minority stretch
        # starts again when it runs again.
        for name in sorted(self.paused):
            self.swarm.daemons[name].cont()
            if name in self.cut_off:
                self._close_window(name)
                self.cut_off[name] = (time.monotonic(), time.time())
            self.note(f"resume {name}")
        self.paused.clear()

    def round(self) -> None:
        """One random action, then 0.5-2 s of watching every view."""
        rng, up = self.rng, [n for n in self.swarm.names if n not in self.down]
        leader = coordinator_of(self.watch.latest, up)
        # A partition in place mostly stays while nodes die and return inside it.
        cut = bool(self.groups)
        choices: list[tuple[str, int]] = [("partition", 1 if cut else 3), ("heal", int(cut))]
        if len(self.down) < 2:
            choices += [("kill", 2), ("kill_leader", 2 if leader else 0), ("pause", 1)]
        if self.down:
            choices += [("restart", 3)]
        action = rng.choices([c for c, _ in choices], [w for _, w in choices])[0]
        if action == "partition":
            self.partition()
        elif action == "heal":
            self.heal()
        elif action == "kill":
            self.kill(rng.choice(up))
        elif action == "kill_leader" and leader is not None:
            self.kill(leader[0], "coordinator ")
        elif action == "pause":
            self.pause(rng.choice(up))
        elif action == "restart":
            self.restart(rng.choice(sorted(self.down)))
        self.watch.watch_for(rng.uniform(0.5, 2.0), self.check_view)
        self.resume_all()

    def log_problems(self) -> list[str]:
        """The adoption logs' violations, and plans a node adopted while cut off with a
        minority, later than a lease after the cut; a voter without a log, or logs that show
        no failover, are problems too (the checker must have something to check)."""
        logs = read_logs(self.swarm.hosts)
        problems = adoption_problems(logs, self.swarm.names)
        problems.extend(f"{name} wrote no adoption log" for name in logs if not logs[name])
        self.logged_terms = {
            (r.term, r.coordinator)
            for records in logs.values()
            for r in records
            if r.kind == "coordinator" and r.coordinator is not None
        }
        if len(self.logged_terms) < 2:
            problems.append(f"the logs show no failover: coordinators {self.logged_terms}")
        self.published = sum(
            r.kind == "plan" and r.backers is not None for records in logs.values() for r in records
        )
        for name, start, end in self.windows:
            problems.extend(
                f"{name} adopted plan {r.plan_term}.{r.plan_version} {r.time - start:.2f} s "
                "into a stretch cut off with a minority"
                for r in logs[name]
                if r.kind == "plan" and start + FAST.lease_s + SLACK_S <= r.time < end
            )
        return problems


def test_randomized_partitions_kills_and_restarts_keep_one_coordinator_per_term(
    netns_cluster: NetnsClusterFactory, record_property: RecordProperty
) -> None:
    seed = int(os.environ.get(CHAOS_SEED_ENV) or random.SystemRandom().randrange(2**32))
    print(f"chaos seed {seed} (rerun with {CHAOS_SEED_ENV}={seed})")
    swarm, watch = _start(netns_cluster, dict(FAST_TIMEOUTS))
    chaos = Chaos(swarm, watch, random.Random(seed), seed)
    started = time.monotonic()
    try:
        for _ in range(CHAOS_ROUNDS):
            chaos.round()
        if not chaos.checked:  # no cut lasted past its lease: one that does, so the checks bite
            chaos.partition()
            watch.watch_for(2 * FAST.lease_s + SLACK_S + 1.0, chaos.check_view)
        if len(chaos.terms) < 2:  # no failover seen yet: kill the coordinator once
            chaos.heal()
            up = [n for n in swarm.names if n not in chaos.down]
            leader = coordinator_of(watch.latest, up)
            if leader is not None:
                chaos.kill(leader[0], "coordinator ")
                watch.watch_for(FAST.lease_s + FAST.election_max_s + SLACK_S, chaos.check_view)
        chaos.heal()
        for name in sorted(chaos.down):
            chaos.restart(name)
        healed_at = time.monotonic()
        watch.wait(
            converged(swarm.names),
            since=healed_at,
            timeout_s=30.0,
            hold_s=1.0,
            message="one coordinator and one plan for all 5 after the final heal",
            on_view=chaos.check_view,
        )
        converged_s = time.monotonic() - healed_at
        final = coordinator_of(watch.matched, swarm.names)
        for name in swarm.names:
            swarm.kill(name)
        problems = chaos.log_problems()
        assert not problems, "adoption log violations:\n" + "\n".join(problems)
    except AssertionError as exc:
        raise AssertionError(chaos.fail(str(exc))) from exc
    record_property("chaos_seed", seed)
    record_property("chaos_converge_s", round(converged_s, 3))
    print(
        f"{CHAOS_ROUNDS} rounds in {healed_at - started:.1f} s, {len(chaos.terms)} coordinator "
        f"terms seen ({len(chaos.logged_terms)} in the adoption logs), {chaos.published} plans "
        f"published, {chaos.checked} views of nodes cut off with a minority checked;"
        f" final {final} {converged_s:.2f} s after the final heal; "
        "schedule:\n  " + "\n  ".join(chaos.history)
    )
