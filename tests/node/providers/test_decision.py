"""An auto-stop decision as a typed record: the same JSON as before (keys, order, values), read
back as itself, a malformed field refused by name, and a malformed kept or pending one skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.providers import AutostopDecision, recover_interrupted
from node.providers.autostop import LAST_DECISION_KEY, WAL_ENTRY_TYPE
from wal import EntryState, WriteAheadLog

DECISION = AutostopDecision("local", "n1", "stop", 600.25, 600, False, 1_700_000_000.5)


def test_a_decisions_json_is_the_wal_payload_then_entry_and_outcome() -> None:
    assert json.dumps(DECISION.payload()) == (
        '{"provider": "local", "node": "n1", "action": "stop", "idle_s": 600.25, '
        '"window_s": 600, "dry_run": false, "decided_at": 1700000000.5}'
    )
    done = AutostopDecision.from_json({**DECISION.payload(), "entry": 4, "outcome": "stopped"})
    assert json.dumps(done.to_json()).endswith(
        '"decided_at": 1700000000.5, "entry": 4, "outcome": "stopped"}'
    )
    assert AutostopDecision.from_json(done.to_json()) == done
    assert DECISION.to_json()["outcome"] == "in progress"
    assert DECISION.to_json()["entry"] is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("provider", 3), ("node", ["n1"]), ("action", "halt"), ("idle_s", "600"),
     ("window_s", True), ("dry_run", "no"), ("dry_run", 0), ("decided_at", {}),
     ("entry", "4"), ("entry", True), ("outcome", 5), ("recovered", "yes")],
)  # fmt: skip
def test_a_malformed_decision_is_refused_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"'{field}'"):
        AutostopDecision.from_json({**DECISION.to_json(), field: value})
    with pytest.raises(ValueError, match="JSON object"):
        AutostopDecision.from_json([DECISION.to_json()])


async def test_a_pending_decision_that_is_not_one_is_committed_and_left_out(
    tmp_path: Path,
) -> None:
    async with WriteAheadLog(tmp_path / "wal.db") as wal:
        bad = await wal.append(WAL_ENTRY_TYPE, {"node": "n1", "idle_s": "long"})
        good = await wal.append(WAL_ENTRY_TYPE, DECISION.payload())
        found = await recover_interrupted(wal)
        assert [decision.entry for decision in found] == [good]
        assert found[0].recovered
        assert found[0].decided_at == DECISION.decided_at
        stored = await wal.get(bad)
        assert stored is not None
        assert stored.state == EntryState.COMMITTED
        kept = await wal.state_get(LAST_DECISION_KEY)
        assert list(kept) == [*DECISION.payload(), "entry", "recovered", "outcome"]
