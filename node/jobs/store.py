"""The job store: one directory per job under `<data_dir>/jobs/<job_id>/` holding its spec,
launch parameters, supervisor and result files, logs and working directory (`work/`).

A job's state is read from its files, so a restarted daemon knows exactly what its supervisor
recorded; this module never starts processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from node.jobs.files import read_result, read_started
from node.jobs.filetypes import JobResultJson, LaunchJson, StartedJson
from node.jobs.records import (
    GangRecord,
    JobRecord,
    JobRequest,
    JobState,
    StreamBytes,
    StreamFlags,
    request_from_dict,
    state_of,
)
from node.jobs.supervise import process_start_ticks, read_json, write_json_atomic

STREAMS = ("stdout", "stderr")
log = logging.getLogger(__name__)


def supervisor_alive(job_dir: Path) -> bool:
    """True while a supervisor holds the job's lock (a free lock: no supervisor runs it)."""
    try:
        fd = os.open(job_dir / "lock", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@dataclass
class JobEntry:
    """One job as the daemon tracks it. Files are the truth; this caches them."""

    job_id: str
    directory: Path
    request: JobRequest
    node: str
    created_at: float
    started: StartedJson | None = None
    result: JobResultJson | None = None
    caps: dict[str, bool] | None = None
    supervisor: subprocess.Popen[bytes] | None = None
    """The subprocess.Popen of a supervisor this daemon started (reaped by the watcher)."""
    gang: GangRecord | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def state(self) -> JobState:
        return state_of(self.result, self.started)

    @property
    def work_dir(self) -> Path:
        return self.directory / "work"

    def log_path(self, stream: str) -> Path:
        return self.directory / f"{stream}.log"

    def log_bytes(self) -> dict[str, int]:
        sizes = {}
        for stream in STREAMS:
            try:
                sizes[stream] = self.log_path(stream).stat().st_size
            except FileNotFoundError:
                sizes[stream] = 0
        return sizes

    def refresh(self) -> None:
        """Re-read the supervisor's files; sets `ended` once a result is there."""
        if self.started is None:
            self.started = read_started(self.directory / "supervisor.json")
        if self.result is None:
            self.result = read_result(self.directory / "result.json")
        self.caps = read_json(self.directory / "caps.json")
        if self.result is not None:
            self.ended.set()

    def cwd(self) -> Path:
        """The job's working directory: `work/`, or `cwd` inside it, or an absolute `cwd`."""
        if self.request.cwd is None:
            return self.work_dir
        given = Path(self.request.cwd)
        return given if given.is_absolute() else self.work_dir / given

    def record(self, max_log_bytes: int) -> JobRecord:
        """The job record of the HTTP API."""
        started, result = self.started, self.result
        capped = (None if result is None else result.get("log_capped")) or self.caps or {}
        return JobRecord(
            job_id=self.job_id,
            name=self.request.name,
            node=self.node,
            argv=self.request.argv,
            state=self.state,
            exit_code=None if result is None else result["exit_code"],
            signal=None if result is None else result["signal"],
            reason=None if result is None else result["reason"],
            created_at=self.created_at,
            started_at=(None if started is None else started["started_at"])
            or (None if result is None else result["started_at"]),
            ended_at=None if result is None else result["ended_at"],
            pid=None if started is None else started["pid"],
            log_bytes=StreamBytes(**self.log_bytes()),
            log_capped=StreamFlags(**{s: bool(capped.get(s)) for s in STREAMS}),
            max_log_bytes=max_log_bytes,
            cwd=self.request.cwd,
            timeout_s=self.request.timeout_s,
            nodes=self.request.nodes,
            role=self.request.role,
            gang=self.gang,
        )


def _gang_of(data: object) -> GangRecord | None:
    return None if data is None else GangRecord.model_validate(data)


class JobStore:
    """The job directories of one node."""

    def __init__(self, root: Path, node: str) -> None:
        self.root = root
        self.node = node

    def open(self) -> list[JobEntry]:
        """Create the root and load every job found there (the daemon's re-attach)."""
        self.root.mkdir(parents=True, exist_ok=True)
        entries = []
        for directory in sorted(self.root.iterdir()):
            if not directory.is_dir():
                continue
            try:
                entry = self.load(directory)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("jobs: skipping %s, its files are unreadable: %s", directory, exc)
                continue
            if entry is not None:
                entries.append(entry)
        return entries

    def load(self, directory: Path) -> JobEntry | None:
        meta = read_json(directory / "spec.json")
        if meta is None:
            return None
        entry = JobEntry(
            job_id=directory.name,
            directory=directory,
            request=request_from_dict(meta["request"]),
            node=str(meta.get("node", self.node)),
            created_at=float(meta["created_at"]),
            gang=_gang_of(read_json(directory / "gang.json")),
        )
        entry.refresh()
        if entry.gang is not None and entry.gang.started_at:
            entry.started = {"started_at": entry.gang.started_at, "pid": None}
        return entry

    def create(self, request: JobRequest, created_at: float) -> JobEntry:
        """Write the job's directory and spec (durably); the job is pending."""
        assert request.job_id is not None
        directory = self.root / request.job_id
        # Traversable, not listable: a run_as user reaches work/ and tmp/; the spec and launch
        # files (the job's environment) are readable by the daemon's user only.
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o711)
        (directory / "work").mkdir(exist_ok=True)
        write_json_atomic(
            directory / "spec.json",
            {"request": request.to_dict(), "node": self.node, "created_at": created_at},
        )
        return JobEntry(request.job_id, directory, request, self.node, created_at)

    @staticmethod
    def write_launch(entry: JobEntry, launch: LaunchJson) -> None:
        write_json_atomic(entry.directory / "launch.json", launch)

    @staticmethod
    def write_kill(entry: JobEntry, signal_name: str, grace_s: float) -> None:
        write_json_atomic(
            entry.directory / "kill.json", {"signal": signal_name, "grace_s": grace_s}
        )

    @staticmethod
    def write_gang(entry: JobEntry) -> None:
        assert entry.gang is not None
        write_json_atomic(entry.directory / "gang.json", entry.gang.to_json())

    @staticmethod
    def record_end(entry: JobEntry, result: JobResultJson) -> None:
        """Record an end the daemon decided (lost, refused): never over a supervisor's result."""
        if (entry.directory / "result.json").exists():
            entry.refresh()
            return
        write_json_atomic(entry.directory / "result.json", result)
        entry.result = result
        entry.ended.set()

    @staticmethod
    def kill_orphans(entry: JobEntry) -> None:
        """SIGKILL the group of a job whose supervisor died, if its leader is still that process."""
        started = entry.started
        pid = None if started is None else started["pid"]
        ticks = None if started is None else started.get("start_ticks")
        if not isinstance(pid, int) or ticks is None or process_start_ticks(pid) != ticks:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def remove(self, entry: JobEntry) -> None:
        shutil.rmtree(entry.directory, ignore_errors=True)
