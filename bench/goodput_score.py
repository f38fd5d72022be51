"""What a run of bench/goodput_bench.py scores, from the JSON lines examples/train.py writes
(`--progress DIR`): rank 0's `step` lines (unix time `t`, `step`, `generation`, `pid`), and
each process's `start`, `restored` and `reformed` lines.

Definitions (docs/benchmarks.md):
- the window runs from the group's first step (t0) to the end of the run (t1);
- `step_time_s`: the median time between two consecutive steps of one group (one pid and
  generation of rank 0), the fault-free pace measured in the same run;
- `final_step`: the last step rank 0 finished in the window, the step the final model holds;
- goodput = (final_step - first_step) * step_time_s / (t1 - t0): the share of the window whose
  steps survive into the final model (steps redone after a restore count once);
- `steps_lost`: steps finished and then rolled back (a group that resumes below the newest step
  finished loses the difference);
- a fault's `to_next_step_s`: from the fault to the first step of a group that did not step
  before the fault (a new generation, or new processes); "n/a" where the system has no
  analogue for the fault; None when no such step came before the next fault or the end.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AppliedFault", "FaultOutcome", "Score", "read_progress", "score"]

NA = "n/a"


@dataclass(frozen=True, slots=True)
class AppliedFault:
    """A fault as the bench applied it: kind, host name, unix time; `applicable` False where
    the system has no analogue (the bench did nothing)."""

    kind: str
    host: str
    at: float
    applicable: bool = True


@dataclass(frozen=True, slots=True)
class FaultOutcome:
    kind: str
    host: str
    at_s: float
    to_next_step_s: float | str | None
    steps_lost: int

    def to_json(self) -> dict[str, Any]:
        value = self.to_next_step_s
        return {
            "kind": self.kind,
            "host": self.host,
            "at": round(self.at_s, 1),
            "to_next_step_s": round(value, 2) if isinstance(value, float) else value,
            "steps_lost": self.steps_lost,
        }


@dataclass(frozen=True, slots=True)
class Score:
    goodput: float
    steps_lost: int
    first_step: int
    final_step: int
    step_time_s: float
    window_s: float
    faults: tuple[FaultOutcome, ...]
    medians: Mapping[str, float | str | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "goodput": round(self.goodput, 4),
            "steps_lost": self.steps_lost,
            "first_step": self.first_step,
            "final_step": self.final_step,
            "step_time_s": round(self.step_time_s, 4),
            "window_s": round(self.window_s, 1),
            "faults": [fault.to_json() for fault in self.faults],
            "median_to_next_step_s": {
                kind: round(value, 2) if isinstance(value, float) else value
                for kind, value in self.medians.items()
            },
        }


def read_progress(directory: Path) -> list[dict[str, Any]]:
    """Every JSON line of every file in `directory`, by time (a torn last line is skipped)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict) and isinstance(line.get("t"), (int, float)):
                lines.append(line)
    return sorted(lines, key=lambda line: float(line["t"]))


def _key(line: Mapping[str, Any]) -> tuple[Any, Any]:
    return line.get("pid"), line.get("generation")


def _step_time(steps: Sequence[Mapping[str, Any]]) -> float:
    gaps = [
        float(b["t"]) - float(a["t"])
        for a, b in itertools.pairwise(steps)
        if _key(a) == _key(b) and int(b["step"]) == int(a["step"]) + 1
    ]
    return statistics.median(gaps) if gaps else 0.0


def _rollbacks(steps: Sequence[Mapping[str, Any]]) -> list[tuple[float, int]]:
    """(when, steps lost) for each time the group resumed below the newest step finished."""
    found: list[tuple[float, int]] = []
    newest = None
    for line in steps:
        step = int(line["step"])
        if newest is not None and step <= newest:
            found.append((float(line["t"]), newest - step + 1))
        newest = step
    return found


def _outcome(
    fault: AppliedFault,
    steps: Sequence[Mapping[str, Any]],
    until: float,
    rollbacks: Sequence[tuple[float, int]],
    t0: float,
) -> FaultOutcome:
    lost = sum(n for at, n in rollbacks if fault.at <= at < until)
    if not fault.applicable:
        return FaultOutcome(fault.kind, fault.host, fault.at - t0, NA, lost)
    seen = {_key(line) for line in steps if float(line["t"]) <= fault.at}
    after = next(
        (
            float(line["t"])
            for line in steps
            if fault.at < float(line["t"]) < until and _key(line) not in seen
        ),
        None,
    )
    to_next = None if after is None else after - fault.at
    return FaultOutcome(fault.kind, fault.host, fault.at - t0, to_next, lost)


def score(lines: Iterable[Mapping[str, Any]], faults: Sequence[AppliedFault], end: float) -> Score:
    """The run's score (module docstring) from its progress `lines`, the `faults` applied, and
    the unix time the run ended. ValueError when rank 0 never finished a step."""
    steps = [line for line in lines if line.get("event") == "step" and float(line["t"]) <= end]
    if not steps:
        raise ValueError("no step was finished: the training never started")
    t0, first = float(steps[0]["t"]), int(steps[0]["step"])
    final = int(steps[-1]["step"])
    step_time = _step_time(steps)
    window = max(end - t0, 1e-9)
    rollbacks = _rollbacks(steps)
    ordered = sorted(faults, key=lambda fault: fault.at)
    outcomes = tuple(
        _outcome(fault, steps, nxt.at if nxt is not None else end, rollbacks, t0)
        for fault, nxt in zip(ordered, [*ordered[1:], None], strict=True)
    )
    medians: dict[str, float | str | None] = {}
    for kind in dict.fromkeys(fault.kind for fault in outcomes):
        values = [f.to_next_step_s for f in outcomes if f.kind == kind]
        numbers = [v for v in values if isinstance(v, float)]
        medians[kind] = statistics.median(numbers) if numbers else (NA if NA in values else None)
    return Score(
        goodput=max(0.0, (final - first) * step_time / window),
        steps_lost=sum(n for _, n in rollbacks),
        first_step=first,
        final_step=final,
        step_time_s=step_time,
        window_s=window,
        faults=outcomes,
        medians=medians,
    )
