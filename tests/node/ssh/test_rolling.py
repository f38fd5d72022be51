"""The rolling upgrade's decisions with a fake SSH side and fake status probes: the order
(voters last, the coordinator last of all), the majority guard before a voter stops, the wait
for a host to come back, and the stop at the first host that does not (the rest untouched)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from node.ssh.deploy import DeployResult
from node.ssh.plan import FAILED, UNCHANGED, UPGRADED
from node.ssh.rolling import (
    PLANNED,
    REFUSED,
    SKIPPED,
    STOPPED,
    UNTOUCHED,
    UPGRADED_AND_SETTLED,
    MemberStatus,
    RollingReport,
    report_lines,
    rolling_order,
    rolling_upgrade,
    settlement,
    voter_guard,
)

HOSTS = ["a", "b", "c", "d", "e"]
VOTERS = ["c", "d", "e"]


@dataclass
class FakeCluster:
    """Members that are up answer; an upgraded host stays down for `down_polls` probes of it
    (forever for hosts in `never_back`); the coordinator is `coordinator` while it is up."""

    up: set[str] = field(default_factory=lambda: set(HOSTS))
    coordinator: str = "e"
    never_back: set[str] = field(default_factory=set)
    down_polls: int = 2
    pending: dict[str, int] = field(default_factory=dict)
    max_down_voters: int = 0
    events: list[str] = field(default_factory=list)

    def stop(self, host: str) -> None:
        self.up.discard(host)
        self.pending[host] = self.down_polls
        down_voters = sum(1 for v in VOTERS if v not in self.up)
        self.max_down_voters = max(self.max_down_voters, down_voters)

    def _tick(self, host: str) -> None:
        left = self.pending.get(host)
        if left is None or host in self.never_back:
            return
        if left <= 0:
            self.up.add(host)
            del self.pending[host]
        else:
            self.pending[host] = left - 1

    async def member(self, host: str) -> MemberStatus | None:
        self._tick(host)
        if host not in self.up:
            return None
        if self.coordinator not in self.up:  # re-elected among the voters that are up
            self.coordinator = min(v for v in VOTERS if v in self.up)
        return MemberStatus(host, host, self.coordinator, 3, "new", frozenset(self.up))


@dataclass
class FakeUpgrader:
    """The SSH side: `plan` says upgraded (or what `plans` says), `upgrade` stops the host in
    the fake cluster and answers upgraded (or failed for hosts in `fail`)."""

    cluster: FakeCluster
    plans: dict[str, str] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)
    upgraded: list[str] = field(default_factory=list)
    recorded: list[str] = field(default_factory=list)
    tails: list[str] = field(default_factory=list)

    async def plan(self, host: str) -> DeployResult:
        status = self.plans.get(host, UPGRADED)
        reason = "probe failed" if status == FAILED else None
        return DeployResult(host, status, 0.1, reason, ("install shoal",), dry_run=True)

    async def upgrade(self, host: str) -> DeployResult:
        self.upgraded.append(host)
        self.cluster.events.append(f"upgrade {host}")
        self.cluster.stop(host)
        if host in self.fail:
            return DeployResult(host, FAILED, 1.0, "install shoal: exited 1: no space left")
        return DeployResult(host, UPGRADED, 1.0, version="0.2.0")

    async def log_tail(self, host: str, lines: int) -> str:
        self.tails.append(host)
        return f"{host} log line 1\n{host}: Traceback: boom"

    async def record(self, host: str, result: DeployResult, *, rolling: bool) -> str | None:
        assert rolling
        self.recorded.append(host)
        return None


def roll(
    cluster: FakeCluster,
    upgrader: FakeUpgrader,
    hosts: list[str] | None = None,
    *,
    dry_run: bool = False,
    settle_timeout_s: float = 30.0,
    progress: Callable[[str], None] = lambda _line: None,
) -> RollingReport:
    now = [0.0]

    async def sleep(seconds: float) -> None:  # a fake clock: no wall time passes
        now[0] += seconds

    return asyncio.run(
        rolling_upgrade(
            hosts or HOSTS,
            members=HOSTS,
            voters=VOTERS,
            upgrader=upgrader,
            probe=cluster,
            dry_run=dry_run,
            settle_timeout_s=settle_timeout_s,
            poll_interval_s=1.0,
            progress=progress,
            clock=lambda: now[0],
            sleep=sleep,
        )
    )


def test_order_puts_voters_last_and_the_coordinator_last_of_all() -> None:
    assert rolling_order(["e", "a", "c", "b", "d"], VOTERS, "c") == ["a", "b", "e", "d", "c"]
    assert rolling_order(["c", "a"], VOTERS, None) == ["a", "c"]
    assert rolling_order(["a", "b"], VOTERS, "e") == ["a", "b"]


def test_guard_needs_a_majority_of_the_whole_voter_set_besides_the_host() -> None:
    assert voter_guard("c", VOTERS, {"c", "d", "e"}) is None
    refusal = voter_guard("c", VOTERS, {"c", "d"})
    assert refusal is not None
    assert "1 of 3 voters" in refusal
    assert "a majority is 2" in refusal
    assert "e" in refusal
    assert voter_guard("c", ["c"], {"c"}) is not None  # one voter can never be rolled
    assert voter_guard("c", ["c", "d"], {"c", "d"}) is not None


def test_settlement_needs_a_majority_seeing_the_host_and_agreeing_on_a_coordinator() -> None:
    def status(host: str, coordinator: str | None, alive: set[str]) -> MemberStatus:
        return MemberStatus(host, host, coordinator, 2, None, frozenset(alive))

    statuses: dict[str, MemberStatus | None] = {
        "a": status("a", "e", {"a", "b", "e"}),
        "b": status("b", "e", {"a", "b"}),
        "c": None,
        "d": status("d", None, {"a", "d"}),
        "e": status("e", "e", {"a", "e"}),
    }
    state = settlement("b", HOSTS, statuses)
    assert (state.seen_by, state.coordinator, state.agree, state.done) == (2, "e", 3, False)
    statuses["e"] = status("e", "e", {"b", "e"})
    assert settlement("b", HOSTS, statuses).done
    statuses["d"] = None
    statuses["a"] = status("a", "d", {"b"})  # the coordinator is no longer agreed
    assert not settlement("b", HOSTS, statuses).done


def test_rolls_every_host_one_at_a_time_voters_last_never_below_a_majority() -> None:
    cluster = FakeCluster()
    upgrader = FakeUpgrader(cluster)
    lines: list[str] = []
    report = roll(cluster, upgrader, ["e", "d", "c", "b", "a"], progress=lines.append)
    assert report.ok
    assert upgrader.upgraded == ["b", "a", "d", "c", "e"]  # e, the coordinator, last
    assert [o.state for o in report.outcomes] == [UPGRADED_AND_SETTLED] * 5
    assert cluster.max_down_voters == 1
    assert upgrader.recorded == upgrader.upgraded
    assert any("waiting: b: alive at" in line for line in lines)


def test_a_host_that_does_not_come_back_stops_the_roll_and_leaves_the_rest_untouched() -> None:
    cluster = FakeCluster(never_back={"a"})
    upgrader = FakeUpgrader(cluster)
    report = roll(cluster, upgrader, settle_timeout_s=10.0)
    assert not report.ok
    assert report.stopped_at == "a"
    assert upgrader.upgraded == ["a"]
    states = {o.host: o.state for o in report.outcomes}
    assert states == {"a": STOPPED, "b": UNTOUCHED, "c": UNTOUCHED, "d": UNTOUCHED, "e": UNTOUCHED}
    stopped = report.outcomes[0]
    assert stopped.reason is not None
    assert "did not come back within 10s" in stopped.reason
    assert stopped.log_tail is not None
    assert "Traceback: boom" in stopped.log_tail
    text = "\n".join(report_lines(report))
    assert "stopped at a; untouched: b, c, d, e" in text
    assert "| a: Traceback: boom" in text


def test_a_failed_upgrade_stops_at_that_host_with_its_log() -> None:
    cluster = FakeCluster()
    upgrader = FakeUpgrader(cluster, fail={"b"})
    report = roll(cluster, upgrader)
    assert report.stopped_at == "b"
    assert upgrader.upgraded == ["a", "b"]
    assert upgrader.tails == ["b"]
    assert upgrader.recorded == ["a"]
    states = [o.state for o in report.outcomes]
    assert states == [UPGRADED_AND_SETTLED, STOPPED, UNTOUCHED, UNTOUCHED, UNTOUCHED]


def test_a_voter_is_refused_when_stopping_it_would_lose_the_majority() -> None:
    cluster = FakeCluster()
    cluster.up.discard("d")  # a voter is down before the roll (and stays down)
    cluster.never_back.add("d")
    upgrader = FakeUpgrader(cluster)
    report = roll(cluster, upgrader, ["a", "c", "e"])
    assert report.stopped_at == "c"
    assert upgrader.upgraded == ["a"]  # c and e were never stopped
    refused = report.outcomes[1]
    assert refused.state == REFUSED
    assert refused.reason is not None
    assert "would leave 1 of 3 voters alive" in refused.reason
    assert report.outcomes[2].state == UNTOUCHED


def test_unchanged_hosts_are_skipped_and_a_failed_plan_stops() -> None:
    cluster = FakeCluster()
    upgrader = FakeUpgrader(cluster, plans={"a": UNCHANGED, "c": FAILED})
    report = roll(cluster, upgrader, ["a", "b", "c", "d"])
    assert [o.state for o in report.outcomes] == [SKIPPED, UPGRADED_AND_SETTLED, STOPPED, UNTOUCHED]
    assert upgrader.upgraded == ["b"]
    assert report.outcomes[2].reason == "probe failed"


def test_dry_run_prints_the_order_and_the_checks_and_changes_nothing() -> None:
    cluster = FakeCluster()
    upgrader = FakeUpgrader(cluster)
    report = roll(cluster, upgrader, dry_run=True)
    assert upgrader.upgraded == []
    assert report.order == ("a", "b", "c", "d", "e")
    assert all(o.state == PLANNED for o in report.outcomes)
    text = "\n".join(report_lines(report))
    assert "rolling upgrade (dry run: nothing changed): order a -> b -> c -> d -> e" in text
    assert "coordinator now: e" in text
    assert "1. a (non-voter): upgraded, 1 steps" in text
    assert "before: at least 2 of the 3 voters answer besides c" in text
    assert "after: c alive at 3 of 5 members and a coordinator named by 3 (within 30s)" in text
    assert "before: at least" not in text.split("3. c")[0]  # non-voters have no guard
    assert "now: holds: 3 of 3 voters answer" in text
    cluster.up.discard("d")
    text = "\n".join(report_lines(roll(cluster, upgrader, ["c"], dry_run=True)))
    assert "now: stopping voter c would leave 1 of 3 voters alive" in text
    document = report.as_dict()
    assert document["dry_run"] is True
    assert document["order"] == ["a", "b", "c", "d", "e"]
    hosts = document["hosts"]
    assert isinstance(hosts, list)
    assert hosts[2]["checks"][0].startswith("before:")


@pytest.mark.parametrize("coordinator", ["c", "d"])
def test_the_current_coordinator_is_upgraded_last(coordinator: str) -> None:
    cluster = FakeCluster(coordinator=coordinator)
    upgrader = FakeUpgrader(cluster)
    report = roll(cluster, upgrader)
    assert report.ok
    assert upgrader.upgraded[-1] == coordinator
