"""Live state between ranks (shoal.live): the ranks agree on the newest step held in memory and
the lowest rank holding it sends its whole state (model, optimizer moments, plain tensors and
values) to the ranks that lack it; nothing is sent when all hold the newest or none holds any."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shoal.live import Holding, LiveStateError, _payload
from tests.cluster.cluster import free_port

WORKER = Path(__file__).with_name("live_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def test_holding_names_the_newest_step_its_lowest_holder_and_who_lacks_it() -> None:
    holding = Holding((5, 9, None, 9))
    assert (holding.newest, holding.source, holding.lacking) == (9, 1, (0, 2))
    assert Holding((None, None)).newest is None
    assert Holding((None, None)).lacking == ()
    assert Holding((3, 3)).lacking == ()


def test_sharded_state_is_refused_with_what_to_do() -> None:
    class DTensor:  # named as torch's: the check reads the type's name
        pass

    with pytest.raises(LiveStateError, match="committed checkpoint"):
        _payload({"model": {"w": DTensor()}})


def run_ranks(steps: str, world: int) -> list[dict[str, Any]]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(world), str(port), steps],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for rank in range(world)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=200)
            assert proc.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return sorted(results, key=lambda r: r["rank"])


@pytest.mark.timeout(240)
def test_the_newest_state_travels_from_its_lowest_holder_to_the_ranks_that_lack_it() -> None:
    results = run_ranks("5,9,none", 3)
    for result in results:
        assert result["steps"] == [5, 9, None]
        assert (result["newest"], result["source"]) == (9, 1)
        assert result["transfer"]["receivers"] == [0, 2]
        assert result["transfer"]["size_bytes"] > 0
        assert result["again"] is False, "after the transfer every rank holds the newest"
    source = results[1]["state"]
    assert source["epoch"] == 9
    assert source["plain"] == 45.0
    assert source["moments"], "the optimizer's moments are part of the state"
    for result in results:
        assert result["state"] == source, f"rank {result['rank']} differs from rank 1"
