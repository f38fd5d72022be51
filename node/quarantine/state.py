"""What a node does about its own GPU faults, round after round, as a pure step: report a fault
until the plan quarantines the node, let the GPUs settle once it is gone, self-test them, ask to
be re-admitted until the plan takes the node back; a held quarantine waits for an undrain.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from health import GpuFault


class Phase(enum.StrEnum):
    """Where a node stands with its GPUs."""

    HEALTHY = "healthy"
    """No fault read, and not quarantined."""
    FAULTY = "faulty"
    """A fault is read now (reported until the plan quarantines the node)."""
    SETTLING = "settling"
    """Quarantined, and fault-free for less than the settle period."""
    SELFTEST = "selftest"
    """Quarantined, fault-free for the settle period: the self-test is due."""
    SELFTEST_FAILED = "selftest_failed"
    """The last self-test failed; it runs again a settle period later."""
    READMITTING = "readmitting"
    """The self-test passed: asking to be re-admitted until a plan takes the node back."""
    HELD = "held"
    """Quarantined the limit's number of times within the hour: only an undrain lifts it."""


class Action(enum.StrEnum):
    """What the round asks of the node."""

    NONE = "none"
    REPORT = "report"
    SELFTEST = "selftest"
    READMIT = "readmit"


@dataclass(frozen=True)
class WatchState:
    """A node's standing: its phase, the fault it reported (or last read), when its GPUs were
    first read fault-free while quarantined, when its last self-test failed and how, and
    whether the coordinator holds its quarantine."""

    phase: Phase = Phase.HEALTHY
    fault: GpuFault | None = None
    clear_since: float | None = None
    failed_at: float | None = None
    selftest: str = ""
    held: bool = False


def step(
    state: WatchState,
    faults: Sequence[GpuFault],
    quarantined: str | None,
    now: float,
    settle_s: float,
) -> tuple[WatchState, Action]:
    """The next standing and action, from the faults read now, this node's reason in the plan
    it applies (None: not quarantined there) and the monotonic time `now`."""
    if faults:
        fault = faults[0]
        if quarantined is None:  # not (yet) out: tell the coordinator, every round until it is
            return WatchState(Phase.FAULTY, fault), Action.REPORT
        phase = Phase.HELD if state.held else Phase.FAULTY
        return WatchState(phase, state.fault or fault, held=state.held), Action.NONE
    if quarantined is None:
        return WatchState(), Action.NONE  # healthy, or back (an undrain lifts a held one too)
    if state.held:
        return dataclasses.replace(state, phase=Phase.HELD), Action.NONE
    clear_since = now if state.clear_since is None else state.clear_since
    state = dataclasses.replace(state, clear_since=clear_since)
    if state.phase is Phase.READMITTING:
        return state, Action.READMIT
    if now - clear_since < settle_s:
        return dataclasses.replace(state, phase=Phase.SETTLING), Action.NONE
    if state.failed_at is not None and now - state.failed_at < settle_s:
        return dataclasses.replace(state, phase=Phase.SELFTEST_FAILED), Action.NONE
    return dataclasses.replace(state, phase=Phase.SELFTEST), Action.SELFTEST


def after_selftest(state: WatchState, passed: bool, detail: str, now: float) -> WatchState:
    """The standing after a self-test: readmitting when it passed, else failed at `now`."""
    if passed:
        return dataclasses.replace(state, phase=Phase.READMITTING, selftest=detail)
    return dataclasses.replace(state, phase=Phase.SELFTEST_FAILED, failed_at=now, selftest=detail)


def held(state: WatchState) -> WatchState:
    """The standing once the coordinator said the quarantine is held."""
    return dataclasses.replace(state, phase=Phase.HELD, held=True)
