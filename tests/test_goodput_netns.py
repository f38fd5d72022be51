"""bench/goodput_bench.py's scenario, short: three netns hosts, examples/train.py saving about
every 5 s, one host's data dir wiped and the host restarted 8 s in, under shoal and under plain
torchrun. Both report goodput; under shoal no group ever resumes below the step the cluster
had committed before it started, and the wiped host resumes from at least the step committed
before its wipe, with files from its peers (seen within 60 s after the 45 s scored). That
run uses `training_reform: restart`; a second one, shoal only, `in_place`: the group steps on
after the wipe and no step is taken twice.

Bounded: 45 s of faults per system (and up to 60 s more for the wiped host's restore), every
namespace and process removed by the bench's cluster even when the run fails or times out."""

from __future__ import annotations

import json

import pytest

from bench import goodput_bench

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]

ARGV = [
    "--minutes", "0.75", "--seed", "3", "--hosts", "3", "--every-s", "60", "--first-s", "8",
    "--kinds", "wipe", "--save-s", "5", "--start-s", "90", "--settle-s", "60",
]  # fmt: skip
RESTART = [*ARGV, "--reform", "restart"]
"""Every group change starts every process, which restores the committed checkpoint."""
IN_PLACE = [
    *ARGV, "--reform", "in_place", "--systems", "shoal", "--settle-s", "5",
    "--minutes", "1.5", "--every-s", "600",
]  # fmt: skip
"""One wipe at 8 s, in a run longer than ARGV's: the wiped host's first worker starts cold (13 s
here when idle, over 37 s at load average 8, where a 45 s run ended before the group stepped
again)."""


def test_a_short_goodput_run_loses_no_committed_step_and_a_wiped_host_restores_from_peers() -> None:
    report = goodput_bench.main(RESTART)
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
    # its disk was empty: what it loaded came from peers, fetched for the restore (`peers`) or
    # copied to it as a replica before its worker asked (`local`)
    assert wiped["restore"]["from"] in ("peers", "local"), described
    assert wiped["committed_before"] is not None, described
    assert wiped["restore"]["step"] >= wiped["committed_before"] > 0, described


def test_in_place_the_group_steps_on_after_a_wipe_and_redoes_nothing() -> None:
    # training_reform: in_place: the two other hosts keep their processes; the wiped host's
    # new worker (no spare: its daemon starts afresh) joins late and takes the newest live
    # step from a peer, so no step is taken twice and the group steps again after the wipe
    report = goodput_bench.main(IN_PLACE)
    described = json.dumps(report, indent=1)[-6000:]
    assert report["reform"] == "in_place", described
    shoal = report["shoal"]
    [wipe] = shoal["faults"]
    assert wipe["kind"] == "wipe", described
    assert isinstance(wipe["to_next_step_s"], float), described
    assert shoal["steps_lost"] == 0, described
    assert shoal["committed_steps_lost"] == 0, described
    assert shoal["goodput"] > 0, described
    # the wiped host's new worker took the live state from a peer
    assert shoal["live_transfers"]["count"] >= 1, described
    assert shoal["live_transfers"]["bytes_median"] > 0, described
