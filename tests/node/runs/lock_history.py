"""The lock clients' own logs and the checker over them.

Each client process appends JSON lines to its own log (times are time.monotonic(), one clock
for every process of the machine): `boot`; per turn `ask` (before asking), `queued` (the first
queue position answered), `start` with the grant's fence (it now believes it holds the lock),
`end` (it stopped acting: body over or cancelled), then `released` or `lost`. The harness
appends `killed` after it SIGKILLed the process (a hold without `end` ends there).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Ask",
    "History",
    "Hold",
    "Window",
    "handovers_after_kill",
    "handovers_after_release",
    "history_problems",
    "read_history",
    "summary",
]

Fence = tuple[int, int]


@dataclass(frozen=True)
class Hold:
    """One stretch during which `holder` (on client `client`) believed it held the lock."""

    client: str
    holder: str
    fence: Fence
    start: float
    end: float
    how: str
    """`released`, `lost`, `killed` (no end logged: the process was SIGKILLed) or `open`."""


@dataclass(frozen=True)
class Ask:
    """One turn of a client: when it asked, when it was first queued, whether it was granted."""

    client: str
    holder: str
    asked: float
    positions: tuple[tuple[float, int], ...]
    """(time, N) of every queue position answered."""
    granted: Hold | None

    @property
    def queued(self) -> float | None:
        return self.positions[0][0] if self.positions else None

    def requeued_at(self) -> float | None:
        """When an answered position first grew (the waiter was put back at the end: it was
        granted and lost the grant before it heard, or its place expired); None if never."""
        for (_, before), (t, after) in zip(self.positions, self.positions[1:], strict=False):
            if after > before:
                return t
        return None


@dataclass
class History:
    holds: list[Hold] = field(default_factory=list)
    asks: list[Ask] = field(default_factory=list)
    kills: dict[str, list[float]] = field(default_factory=dict)
    """Per client, the times the harness SIGKILLed it."""


@dataclass(frozen=True)
class Window:
    """A span of harness time during which the coordinator was failing over (kill or cut,
    up to the new coordinator standing)."""

    start: float
    end: float

    def overlaps(self, start: float, end: float) -> bool:
        return self.start <= end and start <= self.end


def _events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("{") and line.endswith("}"):
            events.append(json.loads(line))
    return events


def parse_client(client: str, events: Sequence[Mapping[str, Any]], now: float) -> History:
    """The holds and asks of one client's events (see the module docstring)."""
    history = History()
    ask: dict[str, Any] | None = None
    holding: dict[str, Any] | None = None
    ended: Hold | None = None
    """The turn's hold once it ended, until `released` or `lost` says how."""

    def finish_turn(granted: Hold | None) -> None:
        nonlocal ask, ended
        if granted is not None:
            history.holds.append(granted)
        if ask is not None:
            positions = tuple(ask["positions"])
            history.asks.append(Ask(client, ask["holder"], ask["t"], positions, granted))
        ask, ended = None, None

    def cut(t: float, how: str) -> None:
        nonlocal holding
        if holding is not None:
            hold = Hold(client, holding["holder"], holding["fence"], holding["t"], t, how)
            holding = None
            finish_turn(hold)
        else:
            finish_turn(ended)

    for event in events:
        kind, t = event["e"], float(event["t"])
        if kind == "ask":
            cut(t, "unknown")
            ask = {"holder": event["holder"], "t": t, "positions": []}
        elif kind == "queued" and ask is not None:
            ask["positions"].append((t, int(event["position"])))
        elif kind == "start":
            fence = event["fence"]
            holding = {"holder": event["holder"], "fence": (int(fence[0]), int(fence[1])), "t": t}
        elif kind == "end" and holding is not None:
            ended = Hold(client, holding["holder"], holding["fence"], holding["t"], t, "ended")
            holding = None
        elif kind in ("released", "lost"):
            finish_turn(None if ended is None else dataclasses.replace(ended, how=kind))
        elif kind == "killed":
            history.kills.setdefault(client, []).append(t)
            cut(t, "killed")
        elif kind == "boot":
            cut(t, "unknown")  # died without a `killed` record: it stopped before this boot
    cut(now, "open")
    return history


def read_history(logs: Mapping[str, Path], now: float) -> History:
    """Every client's log merged; a hold still open is counted up to `now`."""
    merged = History()
    for client, path in sorted(logs.items()):
        one = parse_client(client, _events(path) if path.exists() else [], now)
        merged.holds += one.holds
        merged.asks += one.asks
        merged.kills.update(one.kills)
    merged.holds.sort(key=lambda h: h.start)
    merged.asks.sort(key=lambda a: a.asked)
    return merged


def history_problems(
    history: History, windows: Sequence[Window] = (), requeue_grace_s: float = 0.0
) -> list[str]:
    """Mutual exclusion (no two holds overlap), fences strictly increasing in grant order, and
    FIFO: a waiter queued before another asked is granted first (when both were granted), and
    a waiter's position never grows, except within `requeue_grace_s` after a failover began
    (a grant made while the holder could not hear of it may lapse; it then queues again)."""
    problems = []
    latest: Hold | None = None
    for hold in history.holds:
        if latest is not None:
            if hold.start < latest.end:
                problems.append(f"two holders at once: {latest} and {hold}")
            if hold.fence <= latest.fence:
                problems.append(f"fence did not increase: {latest.fence} then {hold}")
        if latest is None or hold.end >= latest.end:
            latest = hold
    steady = []
    for ask in history.asks:
        requeued = ask.requeued_at()
        if requeued is None:
            steady.append(ask)
        elif _quiet(windows, requeued - requeue_grace_s, requeued):
            problems.append(
                f"FIFO broken: {ask.holder} was moved back in the queue at {requeued:.3f} "
                f"with no failover before: {ask.positions}"
            )
    granted = [a for a in steady if a.granted is not None]
    for first in granted:
        if first.queued is None:
            continue
        for second in granted:
            if second is first or second.asked <= first.queued:
                continue
            assert first.granted is not None
            assert second.granted is not None
            if second.granted.start < first.granted.start:
                problems.append(
                    f"FIFO broken: {first.holder} queued at {first.queued:.3f} before "
                    f"{second.holder} asked at {second.asked:.3f}, but was granted at "
                    f"{first.granted.start:.3f}, after {second.granted.start:.3f}"
                )
    return problems


def _quiet(windows: Iterable[Window], start: float, end: float) -> bool:
    return not any(w.overlaps(start, end) for w in windows)


def handovers_after_release(history: History, windows: Sequence[Window]) -> list[float]:
    """Seconds from a holder stopping (then releasing) to the next grant, when the next holder
    was already queued and no failover overlapped."""
    found = []
    queued_at = {a.granted: a.queued for a in history.asks if a.granted is not None}
    for before, after in zip(history.holds, history.holds[1:], strict=False):
        waited = queued_at.get(after)
        if before.how != "released" or waited is None or waited > before.end:
            continue
        if _quiet(windows, before.end, after.start):
            found.append(after.start - before.end)
    return found


def handovers_after_kill(history: History, windows: Sequence[Window]) -> list[float]:
    """Seconds from SIGKILL of a holder to the next grant (its lease must run out first)."""
    found = []
    for index, hold in enumerate(history.holds):
        if hold.how != "killed" or index + 1 >= len(history.holds):
            continue
        after = history.holds[index + 1]
        if _quiet(windows, hold.end, after.start):
            found.append(after.start - hold.end)
    return found


def summary(values: Sequence[float]) -> str:
    """`n=…, p50=…, p95=…, max=…` in seconds, or `n=0`."""
    if not values:
        return "n=0"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (
        f"n={len(ordered)}, p50={statistics.median(ordered):.3f} s, p95={p95:.3f} s, "
        f"max={ordered[-1]:.3f} s"
    )
