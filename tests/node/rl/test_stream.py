"""RolloutStream against a real daemon's rollouts store: exactly once in (created_at, key)
order, no sample older than max_lag consumed, every dropped one counted."""

from __future__ import annotations

import asyncio
import functools
import random
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from prometheus_client import generate_latest

from node.daemon import NodeDaemon
from node.errors import WeightsError
from node.rl.stream import RolloutStream, rollout_from_json, rollout_record
from node.rl.versions import make_version_state, set_version, stamp_sample
from tests.node.daemons import test_settings

SAMPLES = 10_000
MAX_LAG = 2


def stamped_samples(rng: random.Random) -> list[dict[str, Any]]:
    """Generators at random versions with random delays: the lag of a sample is random."""
    samples = []
    for index in range(SAMPLES):
        state = make_version_state(f"gen-{index % 3}")
        set_version(state, max(0, index // 200 - rng.randint(0, 5)))
        clock = 1_700_000_000.0 + index + rng.random() * 0.5
        samples.append(stamp_sample({"step": index}, state, clock=lambda c=clock: c))
    return samples


async def test_no_stale_sample_is_consumed_and_every_drop_is_counted(tmp_path: Path) -> None:
    rng = random.Random(16)
    records = [
        rollout_record(sample, "r1", sample_id=f"s{i:06d}")
        for i, sample in enumerate(stamped_samples(rng))
    ]
    other_run = [dict(r, sample_id=f"o{i}", run="r2") for i, r in enumerate(records[:50])]
    async with NodeDaemon(test_settings(tmp_path, "solo")) as daemon, ClientSession() as session:
        url = f"http://127.0.0.1:{daemon.port}"
        for start in range(0, SAMPLES, 1000):
            async with session.post(
                f"{url}/v1/records/rollouts", json=records[start : start + 1000]
            ) as r:
                assert r.status == 200, await r.text()
        async with session.post(f"{url}/v1/records/rollouts", json=other_run) as r:
            assert r.status == 200
        # the same store under two names stands for two nodes whose stores replicate each other
        twin = f"http://localhost:{daemon.port}"
        stream = RolloutStream("r1", max_lag=MAX_LAG, batch_size=250, nodes=[url, twin])

        def consume() -> tuple[list[dict[str, Any]], list[int]]:
            consumed, currents = [], []
            current = 0
            while True:
                batch = stream.next_batch(current, timeout_s=0.3)
                if not batch:
                    return consumed, currents
                for record in batch:
                    assert current - record["model_version"] <= MAX_LAG
                consumed += batch
                currents.append(current)
                current += 1

        consumed, _ = await asyncio.to_thread(consume)
    keys = [r["sample_id"] for r in consumed]
    assert len(keys) == len(set(keys))  # exactly once, although read from two "nodes"
    assert all(k.startswith("s") for k in keys)  # only this run
    order = [(r["created_at"], r["sample_id"]) for r in consumed]
    assert order == sorted(order)
    assert stream.dropped_stale > 0
    assert stream.consumed + stream.dropped_stale == SAMPLES  # nothing lost silently
    assert stream.max_lag_seen == MAX_LAG  # samples exactly max_lag behind are consumed
    text = generate_latest(stream.registry).decode()
    assert f'shoal_rollouts_dropped_stale_total{{run="r1"}} {float(stream.dropped_stale)}' in text
    assert f'shoal_rollouts_consumed_total{{run="r1"}} {float(len(consumed))}' in text


@pytest.mark.parametrize("max_lag", [0, 2])
async def test_a_sample_max_lag_behind_is_consumed_and_one_more_is_dropped(
    tmp_path: Path, max_lag: int
) -> None:
    current = 5
    versions = {"too-old": current - max_lag - 1, "at-max-lag": current - max_lag, "now": current}
    records = []
    for i, (name, version) in enumerate(versions.items()):
        state = make_version_state("g", version=version)
        stamped = stamp_sample({"i": i}, state, clock=functools.partial(float, 1_700_000_000 + i))
        records.append(rollout_record(stamped, "r1", sample_id=name))
    async with NodeDaemon(test_settings(tmp_path, "solo")) as daemon, ClientSession() as session:
        url = f"http://127.0.0.1:{daemon.port}"
        async with session.post(f"{url}/v1/records/rollouts", json=records) as r:
            assert r.status == 200, await r.text()
        stream = RolloutStream("r1", max_lag=max_lag, batch_size=len(records), nodes=[url])
        batch = await asyncio.to_thread(stream.next_batch, current, 0.3)
    assert [r["sample_id"] for r in batch] == ["at-max-lag", "now"]
    assert (stream.consumed, stream.dropped_stale, stream.max_lag_seen) == (2, 1, max_lag)


def test_records_need_a_stamped_integer_version() -> None:
    state = make_version_state("g", version=3)
    record = rollout_record(stamp_sample({"x": 1}, state, clock=lambda: 5.0), "r1", "k")
    assert record == {
        "sample_id": "k",
        "created_at": 5.0,
        "model_version": 3,
        "run": "r1",
        "payload": {"x": 1, "generated_at": 5.0, "node": "g"},
    }
    with pytest.raises(WeightsError, match="stamp it first"):
        rollout_record({"x": 1, "generated_at": 1.0}, "r1")
    with pytest.raises(WeightsError, match="max_lag"):
        RolloutStream("r1", max_lag=-1, batch_size=1)


def test_a_rollout_record_reads_back_as_itself() -> None:
    state = make_version_state("g", version=3)
    record = rollout_record(stamp_sample({"x": 1}, state, clock=lambda: 5.0), "r1", "k")
    assert rollout_from_json(record) is record
    with pytest.raises(WeightsError, match="generated_at"):
        rollout_record({"x": 1, "model_version": 1, "generated_at": "soon"}, "r1")


@pytest.mark.parametrize(
    ("field", "value"),
    [("sample_id", 7), ("created_at", "5.0"), ("created_at", True), ("model_version", 1.5),
     ("model_version", None), ("run", 3)],
)  # fmt: skip
def test_a_malformed_rollout_record_is_refused_naming_its_field(field: str, value: object) -> None:
    record = {"sample_id": "k", "created_at": 5.0, "model_version": 3, "run": "r1", "payload": {}}
    with pytest.raises(WeightsError, match=f"rollout record's {field} is"):
        rollout_from_json({**record, field: value})
    with pytest.raises(WeightsError, match="JSON object"):
        rollout_from_json([record])
