"""The GPU settings: `gpus` and `training_nproc`, and the pure rules behind them (owned GPUs,
processes per node, CUDA_VISIBLE_DEVICES, dev-cluster shares)."""

from __future__ import annotations

from typing import Any

import pytest

from config import (
    ConfigError,
    cuda_visible_devices,
    gpu_share,
    load_settings,
    owned_gpus,
    restricts_gpus,
    training_nproc_for,
)


def _settings(**flags: Any) -> Any:
    return load_settings(env={}, flags=flags).settings


def test_gpu_settings_default_to_auto() -> None:
    settings = _settings()
    assert (settings.gpus, settings.training_nproc) == ("auto", "auto")


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("auto", "auto"), ("none", "none"), ([0, 2], (0, 2)), ("1,3", (1, 3)), (["4"], (4,))],
)
def test_gpus_takes_auto_none_or_indices(value: Any, parsed: Any) -> None:
    assert _settings(gpus=value).gpus == parsed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 1], "gpus: lists a GPU twice"),
        ([-1], "gpus: must be auto, none or a list of GPU indices >= 0, got -1"),
        ("all", "gpus: must be auto, none or a list of GPU indices >= 0, got 'all'"),
        ([True], "gpus: must be auto, none or a list of GPU indices >= 0, got True"),
    ],
)
def test_a_bad_gpus_setting_names_the_field(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _settings(gpus=value)


@pytest.mark.parametrize(("value", "parsed"), [("auto", "auto"), (2, 2), ("3", 3)])
def test_training_nproc_takes_auto_or_a_count(value: Any, parsed: Any) -> None:
    assert _settings(training_nproc=value).training_nproc == parsed


@pytest.mark.parametrize("value", [0, -2, "many", True, 1.5])
def test_a_bad_training_nproc_names_the_field(value: Any) -> None:
    with pytest.raises(ConfigError, match="training_nproc: must be auto or an integer >= 1"):
        _settings(training_nproc=value)


def test_owned_gpus_resolve_against_the_host() -> None:
    assert owned_gpus("auto", 4) == (0, 1, 2, 3)
    assert owned_gpus("auto", 0) == ()
    assert owned_gpus("none", 4) == ()
    assert owned_gpus((2, 0), 4) == (2, 0)
    with pytest.raises(ConfigError, match="gpus lists 4 but this host has 4 GPU"):
        owned_gpus((1, 4), 4)
    with pytest.raises(ConfigError, match="NVML sees no GPU"):
        owned_gpus((0,), 0)


def test_training_nproc_is_one_per_owned_gpu_and_never_more() -> None:
    assert training_nproc_for("auto", (0, 1, 2)) == 3
    assert training_nproc_for("auto", ()) == 1
    assert training_nproc_for(2, (0, 1, 2)) == 2
    assert training_nproc_for(4, ()) == 4
    with pytest.raises(ConfigError, match="training_nproc is 3 but this node owns 2 GPU"):
        training_nproc_for(3, (0, 1))


def test_cuda_visible_devices_lists_the_owned_gpus() -> None:
    assert cuda_visible_devices((2, 5)) == "2,5"
    assert cuda_visible_devices([0]) == "0"
    assert cuda_visible_devices(()) is None
    assert restricts_gpus((0, 1))
    assert not restricts_gpus("auto")
    assert not restricts_gpus("none")


def test_dev_cluster_shares_are_round_robin_and_disjoint() -> None:
    assert [gpu_share(i, 3, 8) for i in range(3)] == [(0, 3, 6), (1, 4, 7), (2, 5)]
    assert [gpu_share(i, 2, 1) for i in range(2)] == [(0,), ()]
    assert gpu_share(0, 1, 0) == ()
    shares = [gpu_share(i, 5, 16) for i in range(5)]
    assert sorted(index for share in shares for index in share) == list(range(16))
    with pytest.raises(ConfigError):
        gpu_share(3, 3, 8)


def test_gpu_fault_settings_have_defaults_and_bounds() -> None:
    settings = _settings()
    assert (
        settings.gpu_fault_check_s,
        settings.gpu_readmit_settle_s,
        settings.gpu_quarantine_limit,
        settings.timeouts.gpu_read_s,
        settings.timeouts.gpu_selftest_s,
    ) == (1.0, 10.0, 3, 2.0, 120.0)
    tuned = _settings(gpu_fault_check_s=0.2, gpu_readmit_settle_s=0, gpu_quarantine_limit=1)
    assert (tuned.gpu_fault_check_s, tuned.gpu_quarantine_limit) == (0.2, 1)


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"gpu_fault_check_s": 5}, "gpu_fault_check_s"),
        ({"gpu_fault_check_s": 0}, "gpu_fault_check_s"),
        ({"gpu_readmit_settle_s": -1}, "gpu_readmit_settle_s"),
        ({"gpu_quarantine_limit": 0}, "gpu_quarantine_limit"),
        ({"timeouts.gpu_read_s": 0}, "timeouts.gpu_read_s"),
    ],
)
def test_a_bad_gpu_fault_setting_names_the_field(flags: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        _settings(**flags)
