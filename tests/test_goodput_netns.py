"""bench/goodput_bench.py's scenario, short: three netns hosts, examples/train.py saving every
3 s, one host's data dir wiped and the host restarted 15 s in, under shoal and under plain
torchrun. Both report goodput; under shoal no group ever resumes below the step the cluster
had committed before it started, and the wiped host restores that step from its peers.

Bounded: under a minute of faults per system, every namespace and process removed by the
bench's cluster even when the run fails or times out."""

from __future__ import annotations

import json

import pytest

from bench import goodput_bench

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]

ARGV = [
    "--minutes", "0.9", "--seed", "3", "--hosts", "3", "--every-s", "30", "--kinds", "wipe",
    "--save-s", "3", "--start-s", "90",
]  # fmt: skip


def test_a_short_goodput_run_loses_no_committed_step_and_a_wiped_host_restores_from_peers() -> None:
    report = goodput_bench.main(ARGV)
    described = json.dumps(report, indent=1)[-6000:]
    assert [fault["kind"] for fault in report["planned"]] == ["wipe"], described
    for system in ("shoal", "torchrun"):
        assert isinstance(report[system].get("goodput"), float), described
        assert [fault["kind"] for fault in report[system]["faults"]] == ["wipe"], described
    shoal = report["shoal"]
    assert shoal["goodput"] > 0, described
    # the check is not vacuous: some group started after a step was committed
    assert any(r["committed"] is not None for r in shoal["group_restores"]), described
    assert shoal["committed_steps_lost"] == 0, described
    [wiped] = shoal["wiped_hosts"]
    assert wiped["restore"] is not None, described
    assert wiped["restore"]["from"] == "peers", described
    assert wiped["restore"]["step"] > 0, described
