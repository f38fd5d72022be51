"""The coordinator's side of GPU quarantine on a one-voter lock service: a report quarantines
(once), the planner's source sees it and is told to plan again, re-admission, the held limit,
and the link serving itself while this node coordinates."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from config import load_settings
from health import BreakerRegistry
from node.errors import LockError
from node.locks.service import LockService
from node.quarantine.service import CoordinatorLink, QuarantineService
from node.quarantine.wire import QuarantineBody, ReadmitBody
from node.runtime import NodeRuntime

REASON = "gpu_fault: Xid 79 on GPU-5d8f0e1c-2a"


class MemoryDurable:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def get(self, key: str) -> Any:
        return self.values.get(key)

    async def set(self, key: str, value: Any) -> None:
        self.values[key] = value


@pytest.fixture
async def locks(tmp_path: Path) -> AsyncIterator[LockService]:
    flags = {"data_dir": tmp_path, "node_id": "c", "gpu_quarantine_limit": 2}
    settings = load_settings(env={}, flags=flags).settings
    runtime = NodeRuntime(settings, "c", "127.0.0.1", "0", BreakerRegistry())
    runtime.term, runtime.coordinator = 3, "c"
    service = LockService(runtime, ("c",), MemoryDurable(), None)
    await service.open()
    try:
        yield service
    finally:
        await service.close()


def body(node: str = "n2") -> QuarantineBody:
    return QuarantineBody(node=node, gpu="GPU-5d8f0e1c-2a", fault="xid", reason=REASON)


async def test_a_report_quarantines_once_and_the_planner_is_told(locks: LockService) -> None:
    replans: list[int] = []
    locks.drain_listeners.append(lambda: replans.append(1))
    service = QuarantineService(locks)
    assert locks.quarantines_for(3) is None  # the table of term 3 is not read yet
    answer = await service.report(body())
    assert (answer.quarantined, answer.changed, answer.held, answer.count) == (True, True, False, 1)
    assert (answer.reason, answer.coordinator) == (REASON, "c")
    assert locks.quarantines_for(3) == {"n2": REASON}
    assert locks.quarantines_for(4) is None
    told = len(replans)
    assert told >= 1
    again = await service.report(body())
    assert (again.quarantined, again.changed) == (True, False)
    assert len(replans) == told  # nothing changed: no re-plan
    back = await service.readmit(ReadmitBody(node="n2", selftest="pass"))
    assert (back.quarantined, back.changed, back.count) == (False, True, 1)
    assert locks.quarantines_for(3) == {}
    assert len(replans) == told + 1
    idle = await service.readmit(ReadmitBody(node="n2", selftest="pass"))
    assert idle.changed is False


async def test_the_limit_holds_and_the_link_serves_itself_here(locks: LockService) -> None:
    link = CoordinatorLink(QuarantineService(locks))
    await link.report(body())
    await link.readmit(ReadmitBody(node="n2", selftest="pass"))
    answer = await link.report(body())
    assert (answer.held, answer.count) == (True, 2)
    assert answer.reason is not None
    assert answer.reason.endswith(
        "(quarantined 2 times within 1 h: stays out until shoal node undrain n2)"
    )
    with pytest.raises(LockError) as caught:
        await link.readmit(ReadmitBody(node="n2", selftest="pass"))
    assert caught.value.code == "quarantine_held"
    assert locks.quarantines_for(3) == {"n2": answer.reason}


async def test_a_node_that_does_not_coordinate_asks_the_coordinator(locks: LockService) -> None:
    locks.runtime.coordinator = None
    with pytest.raises(LockError) as caught:
        await CoordinatorLink(QuarantineService(locks)).report(body())
    assert (caught.value.status, caught.value.code) == (503, "not_coordinator")
