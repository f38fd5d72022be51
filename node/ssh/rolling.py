"""`shoal deploy --rolling`: one host at a time, non-voters first, voters last and one at a
time, never stopping a voter unless a majority of the voter set stays alive without it; after
each host, wait until it is alive at a majority of members and a majority agree on one
coordinator. The first host that fails or does not come back stops the roll; the rest stay
untouched. Decisions are pure functions; SSH and the status probes are seams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from node.ssh.deploy import DeployResult
from node.ssh.plan import FAILED, UNCHANGED

SETTLE_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.5
LOG_TAIL_LINES = 20

UPGRADED_AND_SETTLED = "settled"
SKIPPED = "unchanged"
STOPPED = "stopped"
REFUSED = "refused"
UNTOUCHED = "untouched"
PLANNED = "planned"


@dataclass(frozen=True)
class MemberStatus:
    """What one member answered: its node id, the coordinator it names (and the term), its
    version, and the node ids its membership view holds alive."""

    host: str
    node_id: str
    coordinator: str | None
    term: int | None
    version: str | None
    alive: frozenset[str]


class ClusterProbe(Protocol):
    """Asks one member for its /v1/status and /v1/peers (bounded in time)."""

    async def member(self, host: str) -> MemberStatus | None:
        """The member's answer, or None when it did not answer in time."""
        ...


class HostUpgrader(Protocol):
    """The SSH side of one host: plan (read only), upgrade (push, install, restart, healthy),
    the last lines of its daemon's log, and the audit record on its daemon."""

    async def plan(self, host: str) -> DeployResult: ...

    async def upgrade(self, host: str) -> DeployResult: ...

    async def log_tail(self, host: str, lines: int) -> str: ...

    async def record(self, host: str, result: DeployResult, *, rolling: bool) -> str | None:
        """Record the deploy in the host daemon's audit trail; the problem, or None."""
        ...


def majority(count: int) -> int:
    """The smallest strict majority of `count`."""
    return count // 2 + 1


def rolling_order(
    hosts: Sequence[str], voters: Sequence[str], coordinator: str | None = None
) -> list[str]:
    """The order of a rolling upgrade: the non-voters as given, then the voters as given with
    the current coordinator last (so the cluster re-elects once at most)."""
    voter_set = set(voters)
    others = [h for h in hosts if h not in voter_set]
    chosen = [h for h in hosts if h in voter_set]
    chosen.sort(key=lambda h: h == coordinator)
    return [*others, *chosen]


def voter_guard(host: str, voters: Sequence[str], answering: set[str]) -> str | None:
    """Why stopping voter `host` is refused (None: allowed): the voters alive besides it
    must still be a strict majority of the whole voter set."""
    need = majority(len(voters))
    others = sorted(v for v in voters if v != host and v in answering)
    if len(others) >= need:
        return None
    down = sorted(v for v in voters if v != host and v not in answering)
    return (
        f"stopping voter {host} would leave {len(others)} of {len(voters)} voters alive "
        f"(a majority is {need}; not answering: {', '.join(down) or 'none'})"
    )


def agreed_coordinator(
    members: Sequence[str], statuses: Mapping[str, MemberStatus | None]
) -> tuple[str | None, int]:
    """The coordinator named by the most members (at the highest term they name), and how many
    name it; (None, 0) when none names one."""
    votes: dict[tuple[int, str], int] = {}
    for member in members:
        status = statuses.get(member)
        if status is not None and status.coordinator:
            key = (status.term or 0, status.coordinator)
            votes[key] = votes.get(key, 0) + 1
    if not votes:
        return None, 0
    (_, name), count = max(votes.items(), key=lambda item: (item[1], item[0][0]))
    return name, count


@dataclass(frozen=True)
class Settlement:
    """Whether a just-upgraded host has come back: seen alive by `seen_by` members of
    `members`, and `coordinator` named by `agree` of them."""

    host: str
    members: int
    seen_by: int
    coordinator: str | None
    agree: int

    @property
    def done(self) -> bool:
        need = majority(self.members)
        return self.seen_by >= need and self.coordinator is not None and self.agree >= need

    def line(self) -> str:
        need = majority(self.members)
        named = f"{self.coordinator} named by {self.agree}" if self.coordinator else "none"
        return (
            f"{self.host}: alive at {self.seen_by}/{self.members} members (need {need}); "
            f"coordinator: {named} (need {need})"
        )


def settlement(
    host: str, members: Sequence[str], statuses: Mapping[str, MemberStatus | None]
) -> Settlement:
    """How far `host` has come back, from every member's answer (None: no answer)."""
    seen_by = sum(
        1 for m in members if (status := statuses.get(m)) is not None and host in status.alive
    )
    coordinator, agree = agreed_coordinator(members, statuses)
    return Settlement(host, len(members), seen_by, coordinator, agree)


@dataclass(frozen=True)
class HostOutcome:
    """What the roll did with one host: `state` is settled, unchanged, stopped (it failed or
    did not come back), refused (the voter guard), untouched (after a stop), or planned
    (dry run); `checks` the checks that apply to it."""

    host: str
    voter: bool
    state: str
    checks: tuple[str, ...] = ()
    result: DeployResult | None = None
    reason: str | None = None
    log_tail: str | None = None
    audit: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "voter": self.voter,
            "state": self.state,
            "checks": list(self.checks),
            "result": None if self.result is None else self.result.as_dict(),
            "reason": self.reason,
            "log_tail": self.log_tail,
            "audit_problem": self.audit,
        }


@dataclass(frozen=True)
class RollingReport:
    """The order and what happened to each host; `stopped_at` names the host that stopped
    the roll (None: every host done)."""

    order: tuple[str, ...]
    outcomes: tuple[HostOutcome, ...]
    dry_run: bool = False
    stopped_at: str | None = None
    coordinator_before: str | None = None
    voters: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Every host done (or, in a dry run, every host planned without a failure)."""
        failed = any(o.result is not None and o.result.status == FAILED for o in self.outcomes)
        return self.stopped_at is None and not failed

    def as_dict(self) -> dict[str, object]:
        return {
            "order": list(self.order),
            "voters": list(self.voters),
            "coordinator_before": self.coordinator_before,
            "dry_run": self.dry_run,
            "stopped_at": self.stopped_at,
            "hosts": [o.as_dict() for o in self.outcomes],
        }


def host_checks(
    host: str, voters: Sequence[str], members: Sequence[str], settle_timeout_s: float
) -> tuple[str, ...]:
    """The checks around one host's upgrade, as the dry run prints them."""
    checks = []
    if host in voters:
        need = majority(len(voters))
        checks.append(f"before: at least {need} of the {len(voters)} voters answer besides {host}")
    need = majority(len(members))
    checks.append(
        f"after: {host} alive at {need} of {len(members)} members and a coordinator named by "
        f"{need} (within {settle_timeout_s:g}s)"
    )
    return tuple(checks)


async def probe_all(probe: ClusterProbe, hosts: Sequence[str]) -> dict[str, MemberStatus | None]:
    """Every host's answer at once (None where it did not answer)."""
    answers = await asyncio.gather(*(probe.member(h) for h in hosts))
    return dict(zip(hosts, answers, strict=True))


async def wait_settled(
    host: str,
    members: Sequence[str],
    probe: ClusterProbe,
    *,
    timeout_s: float,
    poll_interval_s: float,
    progress: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Settlement:
    """Poll every member until `host` has settled or `timeout_s` passed; the last settlement.
    Each change of the picture is reported through `progress`."""
    deadline = clock() + timeout_s
    last_line = ""
    while True:
        state = settlement(host, members, await probe_all(probe, members))
        if state.line() != last_line:
            last_line = state.line()
            progress(f"  waiting: {last_line}")
        if state.done or clock() >= deadline:
            return state
        await sleep(poll_interval_s)


async def rolling_upgrade(
    hosts: Sequence[str],
    *,
    members: Sequence[str],
    voters: Sequence[str],
    upgrader: HostUpgrader,
    probe: ClusterProbe,
    dry_run: bool = False,
    settle_timeout_s: float = SETTLE_TIMEOUT_S,
    poll_interval_s: float = POLL_INTERVAL_S,
    progress: Callable[[str], None] = lambda _line: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RollingReport:
    """Upgrade `hosts` one at a time (see the module docstring). `members` are the cluster's
    hosts (the inventory), `voters` its voter set. Stops at the first host that fails, is
    refused by the voter guard, or does not settle within `settle_timeout_s`, with its log
    tail; the hosts after it are `untouched`."""
    before = await probe_all(probe, sorted({*members, *voters}))
    coordinator, _ = agreed_coordinator(members, before)
    order = rolling_order(hosts, voters, coordinator)
    voter_set = set(voters)
    outcomes: list[HostOutcome] = []
    if not dry_run:
        progress(f"order: {' -> '.join(order)} (coordinator now: {coordinator})")

    def report(stopped_at: str | None) -> RollingReport:
        done = {o.host for o in outcomes}
        rest = tuple(HostOutcome(h, h in voter_set, UNTOUCHED) for h in order if h not in done)
        return RollingReport(
            tuple(order),
            (*outcomes, *rest),
            dry_run=dry_run,
            stopped_at=stopped_at,
            coordinator_before=coordinator,
            voters=tuple(voters),
        )

    settle = _Settle(members, probe, settle_timeout_s, poll_interval_s, progress, clock, sleep)
    for index, host in enumerate(order, 1):
        voter = host in voter_set
        checks = host_checks(host, voters, members, settle_timeout_s)
        plan = await upgrader.plan(host)
        if dry_run:
            outcomes.append(_planned(host, voter, voters, before, checks, plan))
            continue
        progress(
            f"[{index}/{len(order)}] {host} ({'voter' if voter else 'non-voter'}): {plan.status}"
        )
        outcome = await _roll_one(host, voter, voters, checks, plan, upgrader, probe, settle)
        outcomes.append(outcome)
        if outcome.state in (STOPPED, REFUSED):
            return report(host)
    return report(None)


@dataclass(frozen=True)
class _Settle:
    """How the roll waits for an upgraded host to come back (see wait_settled)."""

    members: Sequence[str]
    probe: ClusterProbe
    timeout_s: float
    poll_interval_s: float
    progress: Callable[[str], None]
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]]


def _planned(
    host: str,
    voter: bool,
    voters: Sequence[str],
    before: Mapping[str, object | None],
    checks: tuple[str, ...],
    plan: DeployResult,
) -> HostOutcome:
    """A host in a dry run: its plan and checks, and for a voter whether the guard holds now."""
    if voter:
        answering = {v for v in voters if before.get(v) is not None}
        refusal = voter_guard(host, voters, answering)
        now = refusal or f"holds: {len(answering)} of {len(voters)} voters answer"
        checks = (*checks, f"now: {now}")
    return HostOutcome(host, voter, PLANNED, checks, plan, plan.reason)


async def _roll_one(
    host: str,
    voter: bool,
    voters: Sequence[str],
    checks: tuple[str, ...],
    plan: DeployResult,
    upgrader: HostUpgrader,
    probe: ClusterProbe,
    settle: _Settle,
) -> HostOutcome:
    """Upgrade one host and wait until it is back: stopped (with its log tail) when it fails
    or does not come back, refused when stopping this voter would leave no majority."""
    if plan.status == FAILED:
        tail = await upgrader.log_tail(host, LOG_TAIL_LINES)
        return HostOutcome(host, voter, STOPPED, checks, plan, plan.reason, tail)
    if plan.status == UNCHANGED:
        return HostOutcome(host, voter, SKIPPED, checks, plan)
    if voter:
        answers = await probe_all(probe, voters)
        refusal = voter_guard(host, voters, {v for v, s in answers.items() if s is not None})
        if refusal is not None:
            return HostOutcome(host, voter, REFUSED, checks, plan, refusal)
    result = await upgrader.upgrade(host)
    if result.status == FAILED:
        tail = await upgrader.log_tail(host, LOG_TAIL_LINES)
        return HostOutcome(host, voter, STOPPED, checks, result, result.reason, tail)
    audit = await upgrader.record(host, result, rolling=True)
    settle.progress(f"  {result.line()}")
    state = await wait_settled(
        host,
        settle.members,
        probe,
        timeout_s=settle.timeout_s,
        poll_interval_s=settle.poll_interval_s,
        progress=settle.progress,
        clock=settle.clock,
        sleep=settle.sleep,
    )
    if not state.done:
        tail = await upgrader.log_tail(host, LOG_TAIL_LINES)
        reason = f"did not come back within {settle.timeout_s:g}s: {state.line()}"
        return HostOutcome(host, voter, STOPPED, checks, result, reason, tail, audit)
    return HostOutcome(host, voter, UPGRADED_AND_SETTLED, checks, result, None, None, audit)


def report_lines(report: RollingReport) -> list[str]:
    """The report for the operator: the order, then per host its state, checks (dry run),
    reason and log tail."""
    title = "rolling upgrade (dry run: nothing changed)" if report.dry_run else "rolling upgrade"
    lines = [
        f"{title}: order {' -> '.join(report.order)}",
        f"voters: {', '.join(report.voters)} (coordinator now: {report.coordinator_before})",
    ]
    for index, outcome in enumerate(report.outcomes, 1):
        kind = "voter" if outcome.voter else "non-voter"
        what = outcome.state
        if outcome.result is not None and outcome.state == PLANNED:
            what = f"{outcome.result.status}, {len(outcome.result.steps)} steps"
        lines.append(f"{index}. {outcome.host} ({kind}): {what}")
        if report.dry_run:
            lines.extend(f"   - {check}" for check in outcome.checks)
        if outcome.reason:
            lines.append(f"   reason: {outcome.reason}")
        if outcome.audit:
            lines.append(f"   audit not recorded: {outcome.audit}")
        if outcome.log_tail:
            lines.append(f"   last log lines of {outcome.host}:")
            lines.extend(f"   | {line}" for line in outcome.log_tail.splitlines())
    if report.stopped_at is not None:
        untouched = [o.host for o in report.outcomes if o.state == UNTOUCHED]
        lines.append(f"stopped at {report.stopped_at}; untouched: {', '.join(untouched) or 'none'}")
    return lines
