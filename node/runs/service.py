"""The run queue on the coordinator: each concurrency group's runs one after another, every
step stored on the voters' majority (with the locks) before the next one, so a new coordinator
continues a run from its last step. Its routes (any node forwards them to the coordinator)
are node.runs.routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from health import LoopHealth
from net import PeerRequestError, peer_url, split_url
from node.component import Check
from node.errors import LockError, RunError
from node.fence import fence_headers
from node.jobs import JobRecord
from node.locks.service import LockService
from node.locks.table import LockTable, acquire, put_run, release, renew
from node.plan import PlanFence
from node.runs.fetch import FetchBody, Member, check_results_node, download_result
from node.runs.nodes import NodeStarter, StaticNodes
from node.runs.queue import (
    MAX_PENDING,
    RunList,
    RunRecord,
    RunSpec,
    RunState,
    RunStep,
    active_runs,
    cancel,
    fence_of,
    final_state,
    new_run,
    next_seq,
    pending_in_group,
    run_lock,
    with_step,
)
from node.runs.results import (
    FetchJson,
    LocalResults,
    NodeResults,
    ResultsStore,
    StoredResultJson,
    result_key,
)
from node.runtime import local_daemon_url

log = logging.getLogger(__name__)

DRIVE_TICK_S = 0.3
RUN_LOCK_TTL_S = 60.0
KILL_GRACE_S = 5.0


class RunService:
    """The queue's driver (while this node coordinates) and what the run routes ask of it
    (submit, list, get, cancel, fetch a result): a component whose routes are node.runs.routes."""

    def __init__(
        self,
        locks: LockService,
        results: ResultsStore | NodeResults,
        stacks: Mapping[str, Mapping[str, Any]],
        *,
        starter: NodeStarter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.locks = locks
        self.results = results
        self.stacks = stacks
        self.starter = starter or StaticNodes()
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.loop_health = LoopHealth("runs")
        self._parsed: dict[str, tuple[Mapping[str, Any], RunRecord]] = {}

    @property
    def _runtime(self) -> Any:
        return self.locks.runtime

    async def open(self) -> None:
        self._task = asyncio.create_task(self._drive_loop(), name="runs-driver")

    async def close(self) -> None:
        """Stop driving runs (a run in progress continues under the next coordinator)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # stored changes

    def runs(self, table: LockTable | None = None) -> dict[str, RunRecord]:
        """The runs of `table` (default: the lock service's), read as RunRecords (each stored
        record is read once)."""
        stored = (self.locks.table if table is None else table).runs
        parsed = {}
        for run_id, data in stored.items():
            cached = self._parsed.get(run_id)
            if cached is None or cached[0] is not data:
                try:
                    cached = (data, RunRecord.model_validate(data))
                except ValueError as exc:
                    raise RunError(
                        500, "bad_run_record", f"run {run_id}: its stored record: {exc}"
                    ) from exc
            parsed[run_id] = cached
        self._parsed = parsed
        return {run_id: record for run_id, (_, record) in parsed.items()}

    async def _put(self, record: RunRecord) -> None:
        stored = record.to_json()
        await self.locks.apply(lambda t, term, now: (put_run(t, term, record.run_id, stored), None))

    # the driver

    async def _drive_loop(self) -> None:
        while True:
            await asyncio.sleep(DRIVE_TICK_S)
            if not self.locks.is_coordinator():
                continue
            try:
                await self.locks.apply(lambda t, term, now: (t, None))
                for record in active_runs(self.runs()):
                    await self.advance(record)
            except (RunError, LockError) as exc:
                self.loop_health.record_failure(getattr(exc, "reason", str(exc)))
                log.warning("runs: %s", exc)
            else:
                self.loop_health.record_success()

    async def advance(self, run: RunRecord) -> None:
        """Take `run` one step further (each step stored before the next)."""
        step = run.step
        if step is RunStep.QUEUED:
            await self._take_lock(run)
        elif step is RunStep.LOCKED:
            chosen = run.nodes_to_start
            if chosen is None:  # the choice is stored first: a repeat starts the same nodes
                nodes_to_start = await self.starter.stopped(run)
                await self._put(run.model_copy(update={"nodes_to_start": tuple(nodes_to_start)}))
                return
            started_nodes = [str(node_id) for node_id in chosen]
            note = await self.starter.start(run, started_nodes)
            runtime = self._runtime
            job_url = peer_url(runtime.address, runtime.port)
            started = with_step(
                run,
                RunStep.STARTING,
                job_node=runtime.node_id,
                job_url=job_url,
                started_nodes=started_nodes,
                note=note,
            )
            await self._put(started)
        elif step is RunStep.STARTING:
            await self._renew_lock(run)
            await self._start_job(run)
        elif step is RunStep.RUNNING:
            await self._renew_lock(run)
            await self._watch_job(run)
        elif step is RunStep.COLLECTING:
            await self._renew_lock(run)
            await self._collect(run)
        elif step is RunStep.STOPPING:
            note = "kept alive (--keep-alive)" if run.keep_alive else await self.starter.stop(run)
            await self._finish(run, note)

    async def _take_lock(self, run: RunRecord) -> None:
        name, holder = run_lock(run.group), run.run_id

        def take(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
            table, answer = acquire(table, term, name, holder, RUN_LOCK_TTL_S, True, now)
            if not answer.granted or answer.fence is None:
                return table, None
            record = with_step(
                run,
                RunStep.LOCKED,
                state=RunState.RUNNING,
                started_at=now,
                fence=answer.fence.to_list(),
                note=f"lock {name} granted, fence {answer.fence.to_list()}",
            )
            return put_run(table, term, holder, record.to_json()), None

        await self.locks.apply(take)

    async def _renew_lock(self, run: RunRecord) -> None:
        name, holder = run_lock(run.group), run.run_id
        fence = fence_of(run)
        state = self.locks.table.get(name)
        if state.holder == holder and state.expires_at - self._clock() > RUN_LOCK_TTL_S / 2:
            return
        await self.locks.apply(lambda t, term, now: renew(t, term, name, holder, fence, now))

    async def _finish(self, run: RunRecord, note: str) -> None:
        name, holder = run_lock(run.group), run.run_id
        fence = fence_of(run)

        def end(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
            if table.get(name).holder == holder:
                table = release(table, term, name, holder, fence, now)
            record = with_step(run, RunStep.DONE, state=final_state(run), ended_at=now, note=note)
            return put_run(table, term, holder, record.to_json()), None

        await self.locks.apply(end)

    # talking to the job's node

    def _url_of(self, node_id: str) -> str:
        runtime = self._runtime
        if node_id == runtime.node_id:
            return local_daemon_url(runtime)
        url = self.locks.url_of(node_id)
        if url is None:
            raise RunError(503, "node_unknown", f"node {node_id} is not in the membership view")
        return url

    def _fence(self) -> dict[str, str]:
        """The fence of the plan this coordinator applies: a node certificate may start and
        kill a run's job on another node only with it (node.identity)."""
        runtime = self._runtime
        runtime.refresh()
        if runtime.term is None or runtime.plan_version is None:
            return {}
        return fence_headers(PlanFence(runtime.term, runtime.plan_version))

    async def _call(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        try:
            base, path_qs = split_url(url)
            return await self.locks.peers.call_json(
                method, base, path_qs, body, headers=self._fence()
            )
        except PeerRequestError as exc:
            raise RunError(502, "node_unreachable", f"{method} {url}: {exc.reason}") from exc

    async def _start_job(self, run: RunRecord) -> None:
        url = self._url_of(str(run.job_node))
        # A job node that does not follow this coordinator yet (it just restarted) would take
        # the job and fail its gang at once ("no coordinator yet"): the run waits for it.
        status, view = await self._call("GET", f"{url}/v1/status")
        following = view.get("coordinator") if isinstance(view, dict) else None
        if status != 200 or following != self._runtime.node_id:
            raise RunError(
                503,
                "job_node_not_ready",
                f"run {run.run_id}: job node {run.job_node} follows {following}, not "
                f"coordinator {self._runtime.node_id} yet; the job starts once it does",
            )
        body = {
            "job_id": run.run_id,
            "name": run.name,
            "argv": list(run.argv),
            "nodes": run.nodes,
            "role": run.role,
        }
        status, answer = await self._call("POST", f"{url}/v1/jobs", body)
        if status not in (200, 201):
            reason = answer.get("reason") if isinstance(answer, dict) else answer
            raise RunError(502, "run_start_failed", f"run {run.run_id}: {status}: {reason}")
        await self._put(with_step(run, RunStep.RUNNING, note=f"job {run.run_id} started"))

    async def _watch_job(self, run: RunRecord) -> None:
        url = f"{self._url_of(str(run.job_node))}/v1/jobs/{run.run_id}"
        status, answer = await self._call("GET", url)
        if status != 200:
            raise RunError(502, "run_job_unknown", f"{url}: {status}: {answer}")
        try:
            job = JobRecord.model_validate(answer)
        except ValueError as exc:
            raise RunError(502, "run_job_unknown", f"{url}: not a job record: {exc}") from exc
        if job.state.ended:
            note = f"job {job.state.value}"
            await self._put(with_step(run, RunStep.COLLECTING, job=job, note=note))
            return
        limit = run.max_duration_s
        started_at = float(run.started_at or 0.0)
        overdue = limit is not None and self._clock() - started_at > float(limit)
        if (overdue and not run.safety_stop) or (run.cancel_requested and not run.kill_sent):
            kill = {"signal": "SIGTERM", "grace_s": KILL_GRACE_S}
            await self._call("POST", f"{url}/kill", kill)
            why = "safety stop: past max_duration_s" if overdue else "cancel requested"
            await self._put(
                with_step(
                    run,
                    RunStep.RUNNING,
                    safety_stop=overdue or run.safety_stop,
                    kill_sent=True,
                    note=why,
                )
            )

    async def _collect(self, run: RunRecord) -> None:
        gang = run.job.gang if run.job is not None else None
        members = [Member(m.node, m.url, m.job_id) for m in (gang.members if gang else ())]
        if not members:
            job_node = str(run.job_node)
            members = [Member(job_node, self._url_of(job_node), run.run_id)]
        uploaded = []
        for member in members:
            for path in run.results:
                uploaded.append(await self._upload(run, member, path))
        done = with_step(run, RunStep.STOPPING, uploaded=uploaded, note="results collected")
        await self._put(done)

    async def _upload(self, run: RunRecord, member: Member, path: str) -> StoredResultJson:
        key = result_key(run.run_id, member.node, path)
        if isinstance(self.results, NodeResults):
            fetch = FetchJson(key=key, node=member.node, job_id=member.job_id, path=path)
            node = self.results.node
            url = local_daemon_url(self._runtime) if node == self._runtime.node_id else None
            url = url or self.locks.url_of(node)
            stored = await self.results.collect(self.locks.peers, url, fetch, self._fence())
        else:
            stored = await download_result(
                self.locks.peers, self.results, key, member.url, member.job_id, path
            )
        return {**stored, "node": member.node, "path": path}

    # the component

    def checks(self) -> Mapping[str, Check]:
        return {"runs": Check(self.loop_health.check, interval_s=1.0)}

    # what the run routes ask (node.runs.routes)

    async def submit_run(self, spec: RunSpec) -> RunRecord:
        """Queue `spec` (this node coordinates); its record. RunError 429 when its group has
        MAX_PENDING runs queued already."""
        created: list[RunRecord] = []

        def submit(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
            runs = self.runs(table)
            if pending_in_group(runs, spec.group) >= MAX_PENDING:
                raise RunError(
                    429, "run_queue_full", f"group {spec.group}: {MAX_PENDING} runs queued"
                )
            record = new_run(spec, next_seq(runs), now)
            created.append(record)
            return put_run(table, term, record.run_id, record.to_json()), None

        await self.locks.apply(submit)
        return created[0]

    async def list_runs(self, group: str | None = None) -> RunList:
        """Every run (of `group`, when given), oldest first, as stored on the majority."""
        await self.locks.apply(lambda t, term, now: (t, None))
        runs = sorted(self.runs().values(), key=lambda r: r.seq)
        return RunList(runs=tuple(r for r in runs if group in (None, r.group)))

    async def get_run(self, run_id: str) -> RunRecord:
        """The run `run_id` as stored on the majority; RunError 404 when there is none."""
        await self.locks.apply(lambda t, term, now: (t, None))
        record = self.runs().get(run_id)
        if record is None:
            raise RunError(404, "run_not_found", f"no run {run_id!r}; `shoal runs list` shows them")
        return record

    async def cancel_run(self, run_id: str) -> RunRecord:
        """Cancel the run `run_id` (queue.cancel); its record. RunError 404 when there is no
        such run, 409 when it ended."""
        await self.get_run(run_id)
        done: list[RunRecord] = []

        def stop(table: LockTable, term: int, now: float) -> tuple[LockTable, None]:
            record = cancel(self.runs(table)[run_id])
            done.append(record)
            return put_run(table, term, run_id, record.to_json()), None

        await self.locks.apply(stop)
        return done[0]

    def own_results(self) -> LocalResults:
        """This node's results store, when it is the results node; RunError 409 otherwise."""
        return check_results_node(self._runtime, self.results)

    async def fetch_result(self, fetch: FetchBody) -> StoredResultJson:
        """Download the file `fetch` names from its member node into this results node's
        store; the stored record, or {"missing": true}. RunError 409 on another node, 503 when
        the member is not in the view, 502 when it cannot be read."""
        store = self.own_results()
        runtime = self._runtime
        node = fetch.node
        member_url = local_daemon_url(runtime) if node == runtime.node_id else None
        member_url = member_url or self.locks.url_of(node)
        if member_url is None:
            raise RunError(503, "node_unknown", f"node {node} is not in this node's view")
        return await download_result(
            self.locks.peers, store, fetch.key, member_url, fetch.job_id, fetch.path
        )
