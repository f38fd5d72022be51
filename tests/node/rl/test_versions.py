"""Version state, stamping and the staleness rule (max_lag counts policy versions)."""

from __future__ import annotations

import pytest

from node.errors import WeightsError
from node.rl.versions import check_staleness, make_version_state, set_version, stamp_sample


def test_stamp_adds_version_time_and_node_without_touching_the_sample() -> None:
    state = make_version_state("gen-1", version=4)
    sample = {"obs": [1, 2], "reward": 0.5}
    stamped = stamp_sample(sample, state, clock=lambda: 123.5)
    assert stamped == {**sample, "model_version": 4, "generated_at": 123.5, "node": "gen-1"}
    assert "model_version" not in sample


def test_versions_only_rise() -> None:
    state = make_version_state("n")
    set_version(state, 3, now=1.0)
    assert state["version"] == 3
    assert state["updated_at"] == 1.0
    with pytest.raises(WeightsError, match="older"):
        set_version(state, 2)
    with pytest.raises(WeightsError):
        make_version_state("n", version=-1)


@pytest.mark.parametrize(
    ("version", "current", "max_lag", "fresh"),
    [(10, 10, 0, True), (9, 10, 0, False), (8, 10, 2, True), (7, 10, 2, False), (12, 10, 0, True)],
)
def test_max_lag_counts_versions(version: int, current: int, max_lag: int, fresh: bool) -> None:
    assert check_staleness({"model_version": version}, current, max_lag) is fresh


def test_a_sample_without_an_integer_version_is_never_fresh() -> None:
    assert not check_staleness({}, 0, 5)
    assert not check_staleness({"model_version": "3"}, 3, 5)
    assert not check_staleness({"model_version": True}, 1, 5)
    with pytest.raises(WeightsError, match="max_lag"):
        check_staleness({"model_version": 1}, 1, -1)
