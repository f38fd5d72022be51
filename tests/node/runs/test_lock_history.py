"""The checker over the lock clients' logs (used by test_locks_netns.py): it finds overlapping
holds, fences that do not increase and FIFO violations, and measures hand-overs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.node.runs.lock_history import (
    Window,
    handovers_after_kill,
    handovers_after_release,
    history_problems,
    read_history,
)


def write(path: Path, events: Sequence[Mapping[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def turn(
    holder: str, asked: float, start: float, end: float, fence: Sequence[int], **extra: Any
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"e": "ask", "t": asked, "holder": holder}]
    for t, position in extra.get("queued", ()):
        events.append({"e": "queued", "t": t, "holder": holder, "position": position})
    events.append({"e": "start", "t": start, "holder": holder, "fence": list(fence)})
    events.append({"e": "end", "t": end, "holder": holder})
    events.append({"e": extra.get("how", "released"), "t": end + 0.01, "holder": holder})
    return events


def test_a_clean_history_passes_and_hand_overs_are_measured(tmp_path: Path) -> None:
    logs = {
        "a": write(tmp_path / "a", turn("a1", 0.0, 0.1, 1.0, [1, 1])),
        "b": write(tmp_path / "b", turn("b1", 0.2, 1.05, 2.0, [1, 2], queued=[(0.3, 1)])),
        "c": write(tmp_path / "c", turn("c1", 0.4, 2.2, 3.0, [2, 1], queued=[(0.5, 2), (1.1, 1)])),
    }
    history = read_history(logs, 10.0)
    assert history_problems(history) == []
    assert [round(v, 3) for v in handovers_after_release(history, [])] == [0.05, 0.2]
    assert [round(v, 3) for v in handovers_after_release(history, [Window(1.5, 2.5)])] == [0.05]


def test_overlapping_holds_are_found(tmp_path: Path) -> None:
    logs = {
        "a": write(tmp_path / "a", turn("a1", 0.0, 0.1, 1.0, [1, 1])),
        "b": write(tmp_path / "b", turn("b1", 0.2, 0.9, 2.0, [1, 2])),
    }
    problems = history_problems(read_history(logs, 10.0))
    assert len(problems) == 1
    assert problems[0].startswith("two holders at once")


def test_a_killed_holder_holds_until_it_died(tmp_path: Path) -> None:
    a_events = [
        {"e": "boot", "t": 0.0},
        {"e": "ask", "t": 0.0, "holder": "a1"},
        {"e": "start", "t": 0.1, "holder": "a1", "fence": [1, 1]},
        {"e": "killed", "t": 3.0},
        {"e": "boot", "t": 3.5},
    ]
    logs = {
        "a": write(tmp_path / "a", a_events),
        "b": write(tmp_path / "b", turn("b1", 0.2, 2.5, 4.0, [1, 2], queued=[(0.3, 1)])),
    }
    history = read_history(logs, 10.0)
    assert [h.how for h in history.holds] == ["killed", "released"]
    assert history_problems(history)[0].startswith("two holders at once")
    logs["b"] = write(tmp_path / "b", turn("b1", 0.2, 5.0, 6.0, [1, 2], queued=[(0.3, 1)]))
    history = read_history(logs, 10.0)
    assert history_problems(history) == []
    assert handovers_after_kill(history, []) == [2.0]


def test_fences_must_increase(tmp_path: Path) -> None:
    logs = {
        "a": write(tmp_path / "a", turn("a1", 0.0, 0.1, 1.0, [2, 5])),
        "b": write(tmp_path / "b", turn("b1", 0.2, 1.1, 2.0, [2, 5])),
    }
    problems = history_problems(read_history(logs, 10.0))
    assert problems == [problems[0]]
    assert problems[0].startswith("fence did not increase")


def test_a_waiter_overtaken_by_a_later_one_breaks_fifo(tmp_path: Path) -> None:
    logs = {
        "a": write(tmp_path / "a", turn("a1", 0.0, 0.1, 1.0, [1, 1])),
        "b": write(tmp_path / "b", turn("b1", 0.2, 2.0, 3.0, [1, 3], queued=[(0.3, 1)])),
        "c": write(tmp_path / "c", turn("c1", 0.4, 1.1, 1.9, [1, 2], queued=[(0.5, 2)])),
    }
    problems = history_problems(read_history(logs, 10.0))
    assert len(problems) == 1
    assert problems[0].startswith("FIFO broken: b1 queued")


def test_moved_back_in_the_queue_is_allowed_only_after_a_failover(tmp_path: Path) -> None:
    logs = {
        "a": write(tmp_path / "a", turn("a1", 0.0, 0.1, 3.0, [1, 1])),
        "b": write(tmp_path / "b", turn("b1", 0.2, 3.1, 4.0, [1, 2], queued=[(0.3, 1), (2.0, 2)])),
    }
    history = read_history(logs, 10.0)
    assert history_problems(history)[0].startswith("FIFO broken: b1 was moved back")
    assert history_problems(history, [Window(1.0, 1.5)], requeue_grace_s=2.0) == []
