"""The job service of a node: starts each job under its own supervisor process, logs every
start and kill in the WAL, watches supervisors, and re-attaches to running jobs after a restart.

Jobs never are children of the daemon's event loop: a supervisor runs in its own session and
keeps running when the daemon dies; the daemon only reaps the supervisors it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from config import JobSettings
from node.errors import JobError
from node.jobs.filetypes import JobResultJson, LaunchJson
from node.jobs.launcher import ForkServer, launch_document, spawn_supervisor
from node.jobs.policy import RunAs, resolve_program, resolve_run_as
from node.jobs.records import (
    GangRecord,
    JobRecord,
    JobRequest,
    JobState,
    new_job_id,
    request_from_dict,
)
from node.jobs.store import JobEntry, JobStore, supervisor_alive
from node.security import request_sender
from wal import RecoveryHandler, WalEntry, WriteAheadLog

log = logging.getLogger(__name__)

JOB_START = "job.start"
JOB_KILL = "job.kill"
WATCH_INTERVAL_S = 0.05
PROBE_INTERVAL_S = 0.5
START_TIMEOUT_S = 10.0
MAX_WAIT_S = 600.0
SUPERVISOR_EXIT_S = 2.0


_DETACHED: list[subprocess.Popen[bytes]] = []
"""Supervisors still running when their service closed (an in-process daemon stopped): polled
on every later spawn so they are reaped, never left as zombies of this process."""


def reap_detached() -> None:
    _DETACHED[:] = [p for p in _DETACHED if p.poll() is None]


def ended_result(state: JobState, reason: str) -> JobResultJson:
    """A result the daemon records itself (no exit status was observed)."""
    return {
        "state": state.value,
        "exit_code": None,
        "signal": None,
        "reason": reason,
        "started_at": None,
        "ended_at": time.time(),
    }


def not_found(job_id: str) -> JobError:
    return JobError(
        404, "job_not_found", f"no job {job_id!r} on this node; GET /v1/jobs lists them"
    )


class JobService:
    """Owns the supervisors this daemon started and the job store. `open()` then `close()`;
    closing never stops a job."""

    def __init__(
        self,
        node_id: str,
        settings: JobSettings,
        root: Path,
        *,
        daemon_url: Callable[[], str],
        rendezvous_env: Callable[[Mapping[str, str]], Mapping[str, str]] | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self.store = JobStore(root, node_id)
        self._daemon_url = daemon_url
        self._rendezvous_env = rendezvous_env
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._run_as: RunAs | None = resolve_run_as(settings)
        self._entries: dict[str, JobEntry] = {}
        self._lock = asyncio.Lock()
        self._wal: WriteAheadLog | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._last_probe = 0.0
        self._reaping: list[subprocess.Popen[bytes]] = []
        self._forks = ForkServer(root / "forkserver.log")
        self.use_fork_server = True
        """False: spawn every supervisor as its own interpreter (slower start, same result)."""
        self._starting: set[str] = set()
        """Jobs between their record and their supervisor's start: not probed as lost."""
        self._closed = False
        self.watch_error: str | None = None
        """Why the last look at the job files failed (None: it worked); shown by health."""
        self.on_end: list[Callable[[JobEntry], None]] = []
        """Called once for every job the watcher sees end."""
        self.gang_kill: Callable[[JobEntry, str, float], Awaitable[None]] | None = None
        """Kills every member of a gang job (set by the gang service)."""

    # lifecycle

    async def open(
        self, wal: WriteAheadLog, recovery: Mapping[str, RecoveryHandler] | None = None
    ) -> None:
        """Load every job directory, finish WAL operations cut off by a crash (`recovery` adds
        handlers of other entry types), decide which jobs ended while the daemon was down,
        and start watching."""
        self._wal = wal
        for entry in await asyncio.to_thread(self.store.open):
            self._entries[entry.job_id] = entry
        if self.use_fork_server:
            self._forks.start()
        handlers = {
            JOB_START: self._recover_start,
            JOB_KILL: self._recover_kill,
            **(recovery or {}),
        }
        result = await wal.recover(handlers)
        log.info("jobs: %d jobs on record, WAL recovery: %s", len(self._entries), result)
        self.poll_once(probe=True)
        self._watcher = asyncio.create_task(self._watch(), name="jobs-watcher")

    async def close(self) -> None:
        """Stop watching. Running jobs keep running. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._forks.close()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        # Supervisors of ended jobs exit right after recording the end: reap them; the rest
        # keep running (that is the point) and are reaped later by reap_detached.
        entries = self._entries.values()
        finishing = [e.supervisor for e in entries if e.supervisor and e.ended.is_set()]
        finishing += self._reaping
        deadline = time.monotonic() + SUPERVISOR_EXIT_S
        while time.monotonic() < deadline and any(p.poll() is None for p in finishing):  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # polling child processes: there is no event to wait on
        supervisors = [e.supervisor for e in entries if e.supervisor is not None]
        _DETACHED.extend(p for p in [*supervisors, *self._reaping] if p.poll() is None)
        self._reaping = []
        for entry in entries:
            entry.supervisor = None

    # queries

    def get(self, job_id: str) -> JobEntry:
        entry = self._entries.get(job_id)
        if entry is None:
            raise not_found(job_id)
        return entry

    def entries(self, state: str | None = None) -> list[JobEntry]:
        """This node's jobs, newest first, optionally only those in `state`."""
        chosen = [e for e in self._entries.values() if state is None or e.state.value == state]
        return sorted(chosen, key=lambda e: (e.created_at, e.job_id), reverse=True)

    def record(self, entry: JobEntry) -> JobRecord:
        return entry.record(self.settings.max_log_bytes)

    def summary(self) -> dict[str, int]:
        """Counts of jobs by state (the status document's `jobs`)."""
        counts = {state.value: 0 for state in JobState}
        for entry in self._entries.values():
            counts[entry.state.value] += 1
        return counts

    # operations

    def check_program(self, request: JobRequest) -> str | None:
        """The executable for the allowlist (None: any program); JobError(403) when refused."""
        return resolve_program(self.settings, request.argv[0])

    async def start(
        self, request: JobRequest, extra_env: Mapping[str, str] | None = None
    ) -> tuple[JobEntry, bool]:
        """Start a job; (entry, True) when started now, (existing entry, False) when the same
        job_id with the same spec exists. JobError 409 for the same id with another spec."""
        executable = self.check_program(request)
        wal = self._open_wal()
        async with self._lock:
            if request.job_id is not None and request.job_id in self._entries:
                return self._existing(request), False
            job_id = request.job_id or new_job_id()
            request = request.with_id(job_id)
            rendezvous = self._rendezvous_for(request)
            payload = {"job_id": job_id, "request": request.to_dict(), "sender": request_sender()}
            entry_id = await wal.append(JOB_START, payload)
            entry = await asyncio.to_thread(self.store.create, request, time.time())
            self._entries[job_id] = entry
            self._starting.add(job_id)
        try:
            launch = self._launch(entry, executable, {**rendezvous, **(extra_env or {})})
            await asyncio.to_thread(self.store.write_launch, entry, launch)
            self._spawn(entry)
            await self._await_started(entry)
        except OSError as exc:
            reason = f"cannot start a supervisor for {job_id}: {exc}"
            self.store.record_end(entry, ended_result(JobState.FAILED, reason))
            await wal.rollback(entry_id, reason=reason)
            raise JobError(500, "job_start_failed", reason) from exc
        finally:
            self._starting.discard(job_id)
        await wal.commit(entry_id)
        pid = None if entry.started is None else entry.started["pid"]
        log.info("job %s started: %s (pid %s)", job_id, request.argv[0], pid)
        return entry, True

    def _existing(self, request: JobRequest) -> JobEntry:
        assert request.job_id is not None
        entry = self._entries[request.job_id]
        if entry.request.spec() != request.spec():
            raise JobError(
                409,
                "job_id_conflict",
                f"job {request.job_id!r} exists with a different spec; choose another job_id "
                "or repeat the same request",
            )
        return entry

    def _rendezvous_for(self, request: JobRequest) -> Mapping[str, str]:
        if request.env_from != "rendezvous":
            return {}
        inherited = {**self._base_env, **request.env}
        env = self._rendezvous_env(inherited) if self._rendezvous_env is not None else {}
        if not env:
            raise JobError(
                409,
                "no_rendezvous",
                f"node {self.node_id} has no training rank in the current plan, so there is no "
                "rendezvous environment; wait for a plan or drop env_from",
            )
        return env

    def _launch(
        self, entry: JobEntry, executable: str | None, extra_env: Mapping[str, str]
    ) -> LaunchJson:
        """What the supervisor needs to run `entry` (launch.json)."""
        return launch_document(
            entry,
            executable,
            extra_env,
            settings=self.settings,
            run_as=self._run_as,
            daemon_url=self._daemon_url(),
            base_env=self._base_env,
        )

    def _spawn(self, entry: JobEntry) -> None:
        """Start the job's supervisor, detached: through the fork server, else by spawning the
        script in its own session (then this daemon reaps it). Its output: supervisor.log."""
        if self._forks.submit(entry.directory):
            return
        reap_detached()
        entry.supervisor = spawn_supervisor(entry.directory)

    async def _await_started(self, entry: JobEntry) -> None:
        """Wait until the supervisor says the job runs (or ended at once)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        delay = 0.002
        while time.monotonic() < deadline:
            entry.refresh()
            if entry.started is not None or entry.result is not None:
                return
            if entry.supervisor is not None and entry.supervisor.poll() is not None:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.005)
        entry.refresh()
        if entry.started is None and entry.result is None:
            self._lost(entry, "the supervisor did not start the job; see supervisor.log")

    async def kill(self, job_id: str, signal_name: str, grace_s: float) -> JobEntry:
        """Ask the job's supervisor to signal its process group, then SIGKILL after the grace.
        A job that already ended is answered as it is."""
        entry = self.get(job_id)
        if entry.state.ended:
            return entry
        wal = self._open_wal()
        payload = {"job_id": job_id, "signal": signal_name, "grace_s": grace_s}
        payload["sender"] = request_sender()
        if entry.gang is not None:
            if self.gang_kill is None:
                raise JobError(503, "jobs_unavailable", "gang jobs are not running on this node")
            entry_id = await wal.append(JOB_KILL, payload)
            await self.gang_kill(entry, signal_name, grace_s)
            await wal.commit(entry_id)
            return entry
        entry_id = await wal.append(JOB_KILL, payload)
        await asyncio.to_thread(self.store.write_kill, entry, signal_name, grace_s)
        await wal.commit(entry_id)
        log.info("job %s: kill with %s, grace %g s", job_id, signal_name, grace_s)
        return entry

    async def wait(self, job_id: str, timeout_s: float) -> JobEntry:
        """The job once it ended, or as it is after `timeout_s`."""
        entry = self.get(job_id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(max(timeout_s, 0.0), MAX_WAIT_S)):
                await entry.ended.wait()
        return entry

    async def delete(self, job_id: str) -> None:
        """Remove an ended job's record, logs and working directory; 409 while it runs."""
        entry = self.get(job_id)
        if not entry.state.ended:
            raise JobError(
                409,
                "job_running",
                f"job {job_id!r} is {entry.state.value}; kill it before deleting",
            )
        self._entries.pop(job_id, None)
        if entry.supervisor is not None:
            self._reaping.append(entry.supervisor)
            entry.supervisor = None
        await asyncio.to_thread(self.store.remove, entry)

    # watching

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                self.poll_once()
            except OSError as exc:  # a full or broken disk: reported to health, keep watching
                if self.watch_error is None:
                    log.warning("jobs: watching job files failed: %s", exc)
                self.watch_error = f"watching job files failed: {exc}"
            else:
                self.watch_error = None

    def poll_once(self, *, probe: bool = False) -> None:
        """Reap supervisors, read results, and (every PROBE_INTERVAL_S) find jobs whose
        supervisor is gone without a result: those are `lost`."""
        self._reaping = [p for p in self._reaping if p.poll() is None]
        now = time.monotonic()
        if now - self._last_probe >= PROBE_INTERVAL_S:
            probe, self._last_probe = True, now
        for entry in list(self._entries.values()):
            if entry.gang is not None:
                continue  # a gang's record: its members run on their nodes (see gang.py)
            supervisor = entry.supervisor
            exited = supervisor is not None and supervisor.poll() is not None
            if exited:
                entry.supervisor = None
            if entry.ended.is_set():
                continue
            entry.refresh()
            if entry.ended.is_set():
                self._notify_end(entry)
                continue
            if exited:
                code = supervisor.returncode if supervisor is not None else None
                self._lost(entry, f"its supervisor exited (code {code}) without recording the end")
            elif (
                supervisor is None
                and probe
                and entry.job_id not in self._starting
                and not supervisor_alive(entry.directory)
            ):
                entry.refresh()
                if not entry.ended.is_set():
                    self._lost(entry, "its supervisor is gone and never recorded the end")
                else:
                    self._notify_end(entry)

    def _lost(self, entry: JobEntry, why: str) -> None:
        JobStore.kill_orphans(entry)
        result = ended_result(JobState.LOST, f"exit status never observed: {why}")
        self.store.record_end(entry, result)
        log.warning("job %s is lost: %s", entry.job_id, why)
        self._notify_end(entry)

    def _notify_end(self, entry: JobEntry) -> None:
        for callback in list(self.on_end):
            try:
                callback(entry)
            except Exception:
                log.exception("jobs: end callback of %s failed", entry.job_id)

    # recovery

    async def _recover_start(self, wal_entry: WalEntry) -> None:
        """A start cut off by a crash: run it if no supervisor ever took it."""
        job_id = str(wal_entry.payload["job_id"])
        entry = self._entries.get(job_id)
        if entry is None:
            request = request_from_dict(wal_entry.payload["request"])
            entry = await asyncio.to_thread(self.store.create, request, time.time())
            self._entries[job_id] = entry
        if entry.started is not None or entry.result is not None:
            return
        if supervisor_alive(entry.directory):
            return
        if not (entry.directory / "launch.json").exists():
            executable = self.check_program(entry.request)
            launch = self._launch(entry, executable, self._rendezvous_for(entry.request))
            await asyncio.to_thread(self.store.write_launch, entry, launch)
        self._spawn(entry)
        await self._await_started(entry)
        log.info("job %s: started after recovery of its WAL entry", job_id)

    async def _recover_kill(self, wal_entry: WalEntry) -> None:
        entry = self._entries.get(str(wal_entry.payload["job_id"]))
        if entry is None or entry.state.ended:
            return
        signal_name = str(wal_entry.payload["signal"])
        grace_s = float(wal_entry.payload["grace_s"])
        await asyncio.to_thread(self.store.write_kill, entry, signal_name, grace_s)

    async def reserve(self, request: JobRequest) -> tuple[JobEntry, bool]:
        """Record a job that runs elsewhere (a gang's own record on the node that received it):
        (new entry, True), or (the existing entry with the same spec, False)."""
        assert request.job_id is not None
        async with self._lock:
            if request.job_id in self._entries:
                return self._existing(request), False
            entry = await asyncio.to_thread(self.store.create, request, time.time())
            entry.gang = GangRecord(members=(), started_at=None)
            await asyncio.to_thread(self.store.write_gang, entry)
            self._entries[request.job_id] = entry
            return entry, True

    def open_wal(self) -> WriteAheadLog:
        """The WAL (JobError 503 before open or after close)."""
        return self._open_wal()

    def _open_wal(self) -> WriteAheadLog:
        if self._wal is None or self._closed:
            raise JobError(503, "jobs_unavailable", "the job service is not running yet")
        return self._wal
