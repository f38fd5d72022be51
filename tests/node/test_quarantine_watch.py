"""A node's GPU fault watcher without a cluster: the pure step (table-driven), the deadline
reads (a stalled driver is a fault and piles no thread up), reporting again every round while
the coordinator cannot be reached, and who may report (a node, for its own GPUs)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import pytest

from config import load_settings
from health import BreakerRegistry, FaultKind, FaultSample, GpuFault, SelfTestResult
from node.errors import LockError
from node.quarantine.routes import check_own
from node.quarantine.state import Action, Phase, WatchState, after_selftest, held, step
from node.quarantine.watcher import DeadlineReads, GpuFaultWatcher
from node.quarantine.wire import FaultName, QuarantineAnswer, QuarantineBody, ReadmitBody
from node.runtime import NodeRuntime, QuarantineView
from node.security import REQUEST_SENDER

FAULT = GpuFault("GPU-a", FaultKind.XID, "Xid 79")
REASON = FAULT.reason
SETTLE_S = 10.0

W, P, A = WatchState, Phase, Action
STEPS: list[tuple[str, WatchState, bool, str | None, float, Phase, Action]] = [
    ("healthy", W(), False, None, 0, P.HEALTHY, A.NONE),
    ("a fault: report", W(), True, None, 0, P.FAULTY, A.REPORT),
    ("reported, not out yet: again", W(P.FAULTY, FAULT), True, None, 1, P.FAULTY, A.REPORT),
    ("out, still faulty", W(P.FAULTY, FAULT), True, REASON, 1, P.FAULTY, A.NONE),
    ("out, clear: settle", W(P.FAULTY, FAULT), False, REASON, 5, P.SETTLING, A.NONE),
    ("settled: self-test", W(P.SETTLING, clear_since=5), False, REASON, 15, P.SELFTEST, A.SELFTEST),
    (
        "failed lately: wait",
        W(P.SELFTEST_FAILED, clear_since=5, failed_at=15),
        False,
        REASON,
        20,
        P.SELFTEST_FAILED,
        A.NONE,
    ),
    (
        "failed a settle period ago: again",
        W(P.SELFTEST_FAILED, clear_since=5, failed_at=15),
        False,
        REASON,
        25,
        P.SELFTEST,
        A.SELFTEST,
    ),
    (
        "passed: ask until back",
        W(P.READMITTING, clear_since=5),
        False,
        REASON,
        30,
        P.READMITTING,
        A.READMIT,
    ),
    ("back", W(P.READMITTING, clear_since=5), False, None, 31, P.HEALTHY, A.NONE),
    (
        "faulty again while settling",
        W(P.SETTLING, clear_since=5),
        True,
        REASON,
        8,
        P.FAULTY,
        A.NONE,
    ),
    ("held: wait", held(W(P.SETTLING)), False, REASON, 50, P.HELD, A.NONE),
    ("held and faulty", held(W(P.FAULTY, FAULT)), True, REASON, 50, P.HELD, A.NONE),
    ("undrained: healthy", held(W(P.HELD)), False, None, 60, P.HEALTHY, A.NONE),
    ("undrained, faulty: report", held(W(P.HELD)), True, None, 60, P.FAULTY, A.REPORT),
]


@pytest.mark.parametrize(
    ("state", "faulty", "quarantined", "now", "phase", "action"),
    [case[1:] for case in STEPS],
    ids=[case[0] for case in STEPS],
)
def test_each_round_steps(
    state: WatchState,
    faulty: bool,
    quarantined: str | None,
    now: float,
    phase: Phase,
    action: Action,
) -> None:
    new, asked = step(state, [FAULT] if faulty else [], quarantined, now, SETTLE_S)
    assert (new.phase, asked) == (phase, action)


def test_the_clear_time_is_kept_and_a_self_test_sets_what_comes_next() -> None:
    state, _ = step(WatchState(Phase.FAULTY, FAULT), [], REASON, 5, SETTLE_S)
    assert state.clear_since == 5
    state, _ = step(state, [], REASON, 9, SETTLE_S)
    assert state.clear_since == 5
    failed = after_selftest(state, False, "failed: GPU-a", 16)
    assert (failed.phase, failed.failed_at, failed.selftest) == (
        Phase.SELFTEST_FAILED,
        16,
        "failed: GPU-a",
    )
    assert after_selftest(state, True, "pass", 16).phase is Phase.READMITTING


def test_the_wire_fault_names_are_the_fault_kinds() -> None:
    assert set(get_args(FaultName)) == {kind.value for kind in FaultKind}


# deadline reads


async def test_a_read_past_its_deadline_is_unreadable_and_no_second_thread_piles_up() -> None:
    release = threading.Event()
    calls: list[Sequence[int]] = []

    def stalled(indices: Sequence[int]) -> list[FaultSample]:
        calls.append(indices)
        release.wait(10)
        return [FaultSample(index=i, uuid=f"GPU-{i}") for i in indices]

    reads = DeadlineReads(stalled)
    first = await reads.read([0, 1], 0.2)
    assert [s.unreadable for s in first] == ["NVML did not answer within 0.2 s"] * 2
    second = await reads.read([0, 1], 0.2)
    assert second[0].unreadable is not None
    assert "has not ended" in second[0].unreadable
    assert len(calls) == 1
    release.set()
    for _ in range(100):
        answer = await reads.read([0], 1.0)
        if answer[0].unreadable is None:
            break
        await asyncio.sleep(0.02)
    assert answer == [FaultSample(index=0, uuid="GPU-0")]
    assert len(calls) == 2


async def test_a_failing_read_raises_in_the_round() -> None:
    def broken(indices: Sequence[int]) -> list[FaultSample]:
        raise RuntimeError("driver gone")

    with pytest.raises(RuntimeError, match="driver gone"):
        await DeadlineReads(broken).read([0], 1.0)


# the watcher, its coordinator unreachable


class Reads:
    def __init__(self) -> None:
        self.xids: tuple[int, ...] = ()

    def read_faults(self, indices: Sequence[int]) -> list[FaultSample]:
        return [
            FaultSample(index=i, uuid=f"GPU-{i}", xids=self.xids if i == 0 else ()) for i in indices
        ]


class Link:
    """A coordinator that cannot be reached `down` times, then quarantines (held on the
    `held_at`-th report)."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.reports: list[QuarantineBody] = []
        self.readmits: list[ReadmitBody] = []

    async def report(self, body: QuarantineBody) -> QuarantineAnswer:
        self.reports.append(body)
        if len(self.reports) <= self.down:
            raise LockError(503, "coordinator_unreachable", "c1: connection refused")
        return QuarantineAnswer(
            node="n", coordinator="c1", quarantined=True, changed=True, count=1, reason=body.reason
        )

    async def readmit(self, body: ReadmitBody) -> QuarantineAnswer:
        self.readmits.append(body)
        return QuarantineAnswer(node="n", coordinator="c1", quarantined=False, changed=True)


async def passing(samples: Sequence[FaultSample], timeout_s: float) -> SelfTestResult:
    return SelfTestResult(True, "fake", "pass", 0.0)


def _watcher(tmp_path: Path, link: Link, reads: Reads, plan: list[Any]) -> GpuFaultWatcher:
    flags = {"data_dir": tmp_path, "node_id": "n", "gpu_readmit_settle_s": 0}
    settings = load_settings(env={}, flags=flags).settings
    runtime = NodeRuntime(settings, "n", "127.0.0.1", "0", BreakerRegistry())
    runtime.owned_gpus = (0, 1)
    return GpuFaultWatcher(
        runtime,
        reads,  # type: ignore[arg-type]
        link,  # type: ignore[arg-type]
        lambda: plan[0],
        selftest=passing,
    )


async def test_a_node_that_cannot_reach_the_coordinator_keeps_reporting(tmp_path: Path) -> None:
    reads, link = Reads(), Link(down=3)
    plan: list[Any] = [None]
    watcher = _watcher(tmp_path, link, reads, plan)
    await watcher.run_round()
    assert link.reports == []
    reads.xids = (79,)
    for _ in range(3):
        await watcher.run_round()
        assert watcher.problem is not None
        assert "connection refused" in watcher.problem
    assert (await watcher.check()).status.value == "degraded"
    await watcher.run_round()
    assert watcher.problem is None
    assert [body.reason for body in link.reports] == ["gpu_fault: Xid 79 on GPU-0"] * 4
    assert watcher.quarantines.labels(fault="xid")._value.get() == 1
    assert watcher.status() == QuarantineView(
        reason="gpu_fault: Xid 79 on GPU-0", state="faulty", selftest=None
    )


class Quarantined:
    """The plan part the watcher reads."""

    def __init__(self, quarantined: dict[str, str]) -> None:
        self.quarantined = quarantined


async def test_once_out_and_clear_it_self_tests_and_asks_back(tmp_path: Path) -> None:
    reads, link = Reads(), Link(down=0)
    plan: list[Any] = [Quarantined({"n": "gpu_fault: Xid 79 on GPU-0"})]
    watcher = _watcher(tmp_path, link, reads, plan)
    await watcher.run_round()  # out, nothing read: settle 0, self-test, readmit
    assert [body.selftest for body in link.readmits] == ["pass"]
    assert phase_of(watcher) is Phase.READMITTING
    await watcher.run_round()  # the plan has not taken it back yet: ask again
    assert len(link.readmits) == 2
    assert watcher.readmissions._value.get() == 2
    plan[0] = Quarantined({})
    await watcher.run_round()
    assert phase_of(watcher) is Phase.HEALTHY
    assert watcher.status() is None


def phase_of(watcher: GpuFaultWatcher) -> Phase:
    return watcher.state.phase


# who may report


def _request(headers: dict[str, str] | None = None) -> Any:
    from aiohttp.test_utils import make_mocked_request

    return make_mocked_request("POST", "/v1/gpu/quarantine", headers=headers or {})


@pytest.mark.parametrize(
    ("sender", "node", "forwarded", "refused"),
    [
        (None, "n1", False, None),
        ("n1", "n1", False, None),
        ("n2", "n1", False, "not_your_gpu"),
        ("n2", "n1", True, None),
        ("cli-laptop", "n1", False, "not_a_node"),
    ],
)
def test_a_node_reports_only_its_own_gpus(
    sender: str | None, node: str, forwarded: bool, refused: str | None
) -> None:
    token = REQUEST_SENDER.set(sender)
    try:
        request = _request({"X-Shoal-Forwarded": "n2"} if forwarded else None)
        if refused is None:
            check_own(request, node)
        else:
            with pytest.raises(LockError) as caught:
                check_own(request, node)
            assert (caught.value.status, caught.value.code) == (403, refused)
    finally:
        REQUEST_SENDER.reset(token)
