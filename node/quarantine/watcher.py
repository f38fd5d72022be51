"""This node's GPU fault watcher: every `gpu_fault_check_s` it reads its owned GPUs' fault
sources (on a thread of its own, with a deadline: a degrading GPU cannot stall it), judges them
(health.judge), and acts on the step (node.quarantine.state): report a fault to the coordinator,
self-test the GPUs once the fault is gone, ask to be re-admitted. Quarantines and re-admissions
are audited and counted here, on the node whose GPU it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from prometheus_client import Counter

from health import (
    CheckResult,
    FaultSample,
    GpuFault,
    GpuReader,
    HealthStatus,
    SelfTestResult,
    judge,
    run_selftest,
)
from node.audit.entries import GPU_QUARANTINE, GPU_READMIT, record_audit
from node.errors import LockError
from node.plan import RolePlan
from node.quarantine.service import CoordinatorLink
from node.quarantine.state import Action, Phase, WatchState, after_selftest, held, step
from node.quarantine.wire import MAX_REASON_CHARS, QuarantineBody, ReadmitBody
from node.runtime import NodeRuntime, QuarantineView

log = logging.getLogger(__name__)

SelfTest = Callable[[Sequence[FaultSample], float], Awaitable[SelfTestResult]]


class DeadlineReads:
    """Reads of the GPUs' fault sources on a thread of their own, each awaited at most a
    deadline. A read that ran past it leaves every GPU unreadable until it ends: a stalled
    driver is a fault, and no second thread piles up behind it."""

    def __init__(self, read: Callable[[Sequence[int]], list[FaultSample]]) -> None:
        self._read = read
        self._pending: asyncio.Future[list[FaultSample]] | None = None
        self._started = 0.0

    async def read(self, indices: Sequence[int], deadline_s: float) -> list[FaultSample]:
        if self._pending is not None and not self._pending.done():
            age = time.monotonic() - self._started
            return _unreadable(indices, f"a GPU read started {age:.0f} s ago has not ended")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[FaultSample]] = loop.create_future()
        self._pending = done

        def answer(result: list[FaultSample] | None, error: BaseException | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                assert result is not None
                done.set_result(result)

        def run() -> None:
            result, error = None, None
            try:
                result = self._read(indices)
            except Exception as exc:  # handed to the awaiting round
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(answer, result, error)

        self._started = time.monotonic()
        threading.Thread(target=run, name="gpu-fault-read", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(done), deadline_s)
        except TimeoutError:
            done.add_done_callback(_retrieve)  # a late failure is not "never retrieved"
            return _unreadable(indices, f"NVML did not answer within {deadline_s:g} s")


def _retrieve(future: asyncio.Future[list[FaultSample]]) -> None:
    if not future.cancelled():
        future.exception()


def _unreadable(indices: Sequence[int], why: str) -> list[FaultSample]:
    return [FaultSample(index=index, uuid="", unreadable=why) for index in indices]


class GpuFaultWatcher:
    """Watches this node's owned GPUs (none: it does nothing). `open()` starts its loop."""

    def __init__(
        self,
        runtime: NodeRuntime,
        reader: GpuReader,
        link: CoordinatorLink,
        plan: Callable[[], RolePlan | None],
        *,
        selftest: SelfTest = run_selftest,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime = runtime
        self._reads = DeadlineReads(reader.read_faults)
        self._link = link
        self._plan = plan
        self._selftest = selftest
        self._clock = clock
        self.state = WatchState()
        self.rounds = 0
        self.ignored: tuple[str, ...] = ()
        """What the latest round that read any read and did not count as a fault."""
        self.problem: str | None = None
        """Why the last call to the coordinator failed (None once one succeeds)."""
        self._previous: dict[int, FaultSample] = {}
        self._uuids: dict[int, str] = {}
        self._task: asyncio.Task[None] | None = None
        registry = runtime.metrics.registry if runtime.metrics is not None else None
        self.quarantines = Counter(
            "shoal_gpu_quarantines_total",
            "Times this node was quarantined for a fault of its own GPU, by kind of fault.",
            ["fault"],
            registry=registry,
        )
        self.readmissions = Counter(
            "shoal_gpu_readmissions_total",
            "Times this node was re-admitted after its GPUs passed the self-test.",
            registry=registry,
        )

    async def open(self) -> None:
        if self.runtime.owned_gpus and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="gpu-fault-watcher")

    async def close(self) -> None:
        """Stop the loop. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        period_s = self.runtime.settings.gpu_fault_check_s
        while True:
            started = self._clock()
            try:
                await self.run_round()
            except Exception as exc:  # recorded in the check; the next round tries again
                log.exception("GPU fault round failed")
                self.problem = f"the GPU fault round failed: {exc!r}"
            await asyncio.sleep(max(0.0, period_s - (self._clock() - started)))

    async def run_round(self) -> None:
        """Read, judge and act once."""
        runtime = self.runtime
        timeouts = runtime.settings.timeouts
        samples = await self._reads.read(runtime.owned_gpus, timeouts.gpu_read_s)
        faults: list[GpuFault] = []
        ignored: list[str] = []
        for sample in samples:
            if sample.uuid:
                self._uuids[sample.index] = sample.uuid
            else:
                sample = dataclasses.replace(sample, uuid=self._uuids.get(sample.index, ""))
            verdict = judge(sample, self._previous.get(sample.index))
            faults.extend(verdict.faults)
            ignored.extend(verdict.ignored)
            if sample.unreadable is None:
                self._previous[sample.index] = sample
        if ignored:
            if tuple(ignored) != self.ignored:
                log.info("GPU events that quarantine nothing: %s", "; ".join(ignored))
            self.ignored = tuple(ignored)
        plan = self._plan()
        reason = None if plan is None else plan.quarantined.get(runtime.node_id)
        now = self._clock()
        before = self.state.phase
        self.state, action = step(
            self.state, faults, reason, now, runtime.settings.gpu_readmit_settle_s
        )
        if self.state.phase is not before:
            log.info("GPU faults: %s -> %s", before.value, self.state.phase.value)
        if action is Action.REPORT:
            await self._report()
        elif action is Action.SELFTEST:
            result = await self._selftest(samples, timeouts.gpu_selftest_s)
            log.info("GPU self-test: %s", result.to_json())
            self.state = after_selftest(self.state, result.passed, result.detail, self._clock())
            if result.passed:
                await self._readmit()
        elif action is Action.READMIT:
            await self._readmit()
        self.rounds += 1

    async def _report(self) -> None:
        fault = self.state.fault
        assert fault is not None
        body = QuarantineBody(
            node=self.runtime.node_id,
            gpu=fault.uuid[:100],
            fault=fault.kind.value,
            reason=fault.reason[:MAX_REASON_CHARS],
        )
        try:
            answer = await self._link.report(body)
        except LockError as exc:
            self._failed(f"reporting {fault.reason} to the coordinator failed: {exc.reason}")
            return
        self.problem = None
        if answer.held:
            self.state = held(self.state)
        if answer.changed:
            log.warning("quarantined by %s: %s", answer.coordinator, answer.reason)
            self.quarantines.labels(fault=fault.kind.value).inc()
            detail = {"reason": answer.reason, "count": answer.count, "held": answer.held}
            await self._audit(GPU_QUARANTINE, {**detail, "coordinator": answer.coordinator})

    async def _readmit(self) -> None:
        body = ReadmitBody(node=self.runtime.node_id, selftest=self.state.selftest[:300])
        try:
            answer = await self._link.readmit(body)
        except LockError as exc:
            if exc.code == "quarantine_held":
                self.state = held(self.state)
                self.problem = None
                return
            self._failed(f"asking the coordinator to re-admit this node failed: {exc.reason}")
            return
        self.problem = None
        if answer.changed:
            log.info("re-admitted by %s (self-test: %s)", answer.coordinator, body.selftest)
            self.readmissions.inc()
            detail = {"selftest": body.selftest, "coordinator": answer.coordinator}
            await self._audit(GPU_READMIT, detail)

    def _failed(self, problem: str) -> None:
        level = logging.DEBUG if self.problem is not None else logging.WARNING
        log.log(level, "%s; trying again next round", problem)
        self.problem = problem

    async def _audit(self, entry_type: str, detail: Mapping[str, object]) -> None:
        runtime = self.runtime
        await record_audit(
            runtime.wal, entry_type, {"name": runtime.node_id, **detail}, runtime.node_id
        )

    def status(self) -> QuarantineView | None:
        """This node's quarantine for /v1/status: the reason (the plan's, or the fault read
        now), the phase and the last self-test's outcome; None while it has neither."""
        plan = self._plan()
        reason = None if plan is None else plan.quarantined.get(self.runtime.node_id)
        state = self.state
        if reason is None and state.phase is not Phase.FAULTY:
            return None
        if reason is None and state.fault is not None:
            reason = state.fault.reason
        return QuarantineView(
            reason=reason, state=state.phase.value, selftest=state.selftest or None
        )

    async def check(self) -> CheckResult:
        """Not applicable without owned GPUs; degraded while a fault is read or the node is
        quarantined (saying why and what comes next), or when the coordinator cannot be told."""
        if not self.runtime.owned_gpus:
            return CheckResult(HealthStatus.NOT_APPLICABLE, "this node owns no GPU")
        metrics = {"rounds": float(self.rounds)}
        shown = self.status()
        if shown is not None:
            message = f"{shown.reason}: {shown.state}"
            if self.state.selftest:
                message += f" (self-test: {self.state.selftest})"
            return CheckResult(HealthStatus.DEGRADED, message, metrics)
        if self.problem is not None:
            return CheckResult(HealthStatus.DEGRADED, self.problem, metrics)
        note = f"; not faults: {'; '.join(self.ignored)}" if self.ignored else ""
        count = len(self.runtime.owned_gpus)
        return CheckResult(HealthStatus.HEALTHY, f"{count} GPUs without faults{note}", metrics)
