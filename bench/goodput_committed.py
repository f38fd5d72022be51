"""Committed steps in bench/goodput_bench.py: which step each system had committed when, and
whether a group that started afterwards resumed from it.

- shoal: a probe on a host of its own (no daemon: no fault touches it) polls GET /v1/training
  of every daemon (`python bench/goodput_committed.py --secret-file F ADDRESS:PORT ...`, one
  JSON line per answer): `committed.step` (kept on a majority) and each node's `last_restore`
  (`from`: local or peers);
- torchrun: the newest step DCP finished in the checkpoint directory the ranks share, read
  every second by the bench (`finished_checkpoint`).

`committed_lost` compares every group's restore (rank 0's `restored` line) with the newest
step committed before that process started: a group that resumed below it lost committed
steps, which must never happen (issue 33: 0 committed steps lost).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["committed_lost", "finished_checkpoint", "probe_argv", "read_probe", "wipe_restores"]

TRAINING_PATH = "/v1/training"
PROBE_INTERVAL_S = 2.0


def probe_argv(secret_file: Path, endpoints: Iterable[str]) -> list[str]:
    """The probe's command line (run it on a host with no daemon)."""
    return [
        sys.executable, str(Path(__file__).resolve()),
        "--secret-file", str(secret_file),
        "--interval-s", f"{PROBE_INTERVAL_S:g}",
        "--timeout-s", "5",
        *endpoints,
    ]  # fmt: skip


def _fields(document: Any) -> dict[str, object]:
    nodes = document.get("nodes") or {}
    return {
        "wall": time.time(),
        "committed": (document.get("committed") or {}).get("step"),
        "restores": {name: part.get("last_restore") for name, part in nodes.items()},
    }


def read_probe(log: Path) -> tuple[list[tuple[float, int]], list[dict[str, Any]]]:
    """From the probe's log: (unix time, committed step) of every answer that named one, and
    every answer's line."""
    committed: list[tuple[float, int]] = []
    answers: list[dict[str, Any]] = []
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(line, dict) or "wall" not in line:
            continue
        answers.append(line)
        if isinstance(line.get("committed"), int):
            committed.append((float(line["wall"]), int(line["committed"])))
    return committed, answers


def finished_checkpoint(shared: Path) -> int | None:
    """The newest step DCP finished in the shared checkpoint directory (torchrun's analogue
    of a committed step), None before the first."""
    from shoal._checkpoint_files import finished_steps

    steps = finished_steps(shared) if shared.exists() else []
    return max((step for step, _ in steps), default=None)


def committed_lost(
    lines: Sequence[Mapping[str, Any]], committed: Sequence[tuple[float, int]]
) -> tuple[int, list[dict[str, Any]]]:
    """Committed steps lost over the run, and each group's restore beside the newest step
    committed before its rank 0 process started."""
    starts = {line.get("pid"): float(line["t"]) for line in lines if line.get("event") == "start"}
    ordered = sorted(committed)
    lost, restores = 0, []
    for line in lines:
        if line.get("event") != "restored" or line.get("rank") != 0:
            continue
        began = starts.get(line.get("pid"), float(line["t"]))
        before = max((step for at, step in ordered if at < began), default=None)
        step = int(line.get("step") or 0)
        short = 0 if before is None else max(0, before - step)
        lost += short
        restores.append({"at": round(float(line["t"]), 1), "step": step, "committed": before})
    return lost, restores


def wipe_restores(
    answers: Sequence[Mapping[str, Any]],
    wipes: Sequence[tuple[str, float]],
    committed: Sequence[tuple[float, int]] = (),
) -> list[dict[str, Any]]:
    """For each wiped host (name, unix time of the wipe): the step committed before the wipe
    and the host's first restore recorded after it (`from`: `peers` when it fetched files for
    the restore, `local` when copies from peers reached it first: its disk was empty), or
    None when none was seen."""
    found: list[dict[str, Any]] = []
    keys = ("step", "from", "bytes", "fetched_bytes", "seconds")
    for host, at in wipes:
        restore = None
        for answer in answers:
            seen = (answer.get("restores") or {}).get(host)
            if isinstance(seen, dict) and float(seen.get("at") or 0) > at:
                restore = {key: seen.get(key) for key in keys}
                break
        before = max((step for when, step in committed if when < at), default=None)
        found.append({"host": host, "committed_before": before, "restore": restore})
    return found


def main(argv: list[str]) -> int:
    from tests.node.netns_probe import run_probe

    return run_probe(argv, __doc__.splitlines()[0], TRAINING_PATH, _fields, PROBE_INTERVAL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
