"""The per-job supervisor: `python supervise.py JOB_DIR` runs one job in its own process group,
copies its output into capped log files, enforces the timeout and kill requests, reaps every
descendant and records the exit status atomically. Standard library only, so it starts fast and
keeps running when the daemon that started it dies.

Files of JOB_DIR it reads: `launch.json` (argv, env, cwd, timeout_s, kill_grace_s,
max_log_bytes, user), `kill.json` (a kill request: signal, grace_s). Files it writes:
`stdout.log`, `stderr.log`, `caps.json` (which stream hit the cap), `supervisor.json` (pids,
once the job runs), `result.json` (the end: state, exit_code, signal, reason), `supervisor.log`.
It holds an exclusive flock on `lock` for its whole life: a free lock means no supervisor.
The JSON files' shapes are node.jobs.files' TypedDicts.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

if TYPE_CHECKING:  # the script imports nothing of shoal: these are for mypy only
    from node.jobs.filetypes import JobResultJson, LaunchJson

POLL_S = 0.02
LOCK_TRIES = 100
DRAIN_S = 2.0
REAP_S = 5.0
READ_BYTES = 1 << 16
PR_SET_CHILD_SUBREAPER = 36
STREAMS = ("stdout", "stderr")


def write_json_atomic(path: Path, data: Mapping[str, object], *, durable: bool = True) -> None:
    """Write `data` to `path` so a reader sees the old file or the whole new one; `durable`
    also survives a power loss (fsync of the file and its directory)."""
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(temp, path)
    if not durable:
        return
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is absent."""
    try:
        with path.open(encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (tells a reused pid apart), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def take_lock(job_dir: Path) -> int | None:
    """The fd holding the job's exclusive lock, or None when another supervisor holds it."""
    fd = os.open(job_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    for _ in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            time.sleep(0.01)  # the daemon may be probing the lock for a moment
    os.close(fd)
    return None


def become_subreaper() -> None:
    """Orphaned descendants of the job are re-parented to us, so we reap them (no zombies)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the process group kill still ends the job's processes


class RunAs(TypedDict, total=False):
    """The user, group and supplementary groups a job's command runs as (Popen's)."""

    user: int
    group: int
    extra_groups: list[int]


class CappedLog:
    """One output stream copied from a pipe into a file, at most `cap` bytes kept."""

    def __init__(self, job_dir: Path, stream: str, cap: int) -> None:
        self.stream = stream
        self.cap = cap
        self.path = job_dir / f"{stream}.log"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        self.written = os.fstat(self.fd).st_size
        self.capped = self.written >= cap > 0

    def write(self, data: bytes) -> bool:
        """Append what fits under the cap; True when this write hit the cap for the first time."""
        room = self.cap - self.written
        chunk = data[: max(room, 0)]
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view) :]
        self.written += len(chunk)
        if len(chunk) < len(data) and not self.capped:
            self.capped = True
            return True
        return False

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


class Supervisor:
    """Runs the job of one directory from start to recorded end."""

    def __init__(self, job_dir: Path, launch: LaunchJson) -> None:
        self.job_dir = job_dir
        self.launch = launch
        cap = int(launch.get("max_log_bytes", 0)) or (1 << 62)
        self.logs = {stream: CappedLog(job_dir, stream, cap) for stream in STREAMS}
        self.selector = selectors.DefaultSelector()
        self.child: subprocess.Popen[bytes] | None = None
        self.status: int | None = None
        self.ending: str | None = None
        self.ending_signal: str | None = None
        self.kill_deadline: float | None = None
        self.kill_grace_s = float(launch.get("kill_grace_s", 10.0))

    def run(self) -> JobResultJson:
        """Start the job and supervise it to the end; returns the result to record."""
        started_at = time.time()
        try:
            self.child = self.spawn()
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, LookupError) as exc:
            self.close_logs()
            return {
                "state": "failed",
                "exit_code": None,
                "signal": None,
                "reason": f"cannot start {self.launch['argv'][0]!r}: {exc}",
                "started_at": None,
                "ended_at": time.time(),
            }
        # Not fsynced: it names processes, which a power loss ends anyway (the job is then
        # lost, with or without this file); result.json is durable.
        write_json_atomic(
            self.job_dir / "supervisor.json",
            {
                "supervisor_pid": os.getpid(),
                "pid": self.child.pid,
                "pgid": self.child.pid,
                "start_ticks": process_start_ticks(self.child.pid),
                "started_at": started_at,
            },
            durable=False,
        )
        timeout_s = self.launch.get("timeout_s")
        deadline = time.monotonic() + float(timeout_s) if timeout_s else None
        while True:
            self.pump(POLL_S)
            if self.reap():
                break
            now = time.monotonic()
            if self.ending is None:
                request = read_json(self.job_dir / "kill.json")
                if request is not None:
                    name = str(request.get("signal", "SIGTERM"))
                    grace = float(request.get("grace_s", self.kill_grace_s))
                    self.begin_end("killed", name, grace)
                elif deadline is not None and now >= deadline:
                    self.begin_end("timed_out", "SIGTERM", self.kill_grace_s)
            elif self.kill_deadline is not None and now >= self.kill_deadline:
                self.signal_group(signal.SIGKILL)
                self.ending_signal = "SIGKILL"
                self.kill_deadline = None
        self.finish_group()
        return self.result(started_at)

    def spawn(self) -> subprocess.Popen[bytes]:
        launch = self.launch
        user = launch.get("user")
        extra: RunAs = {}
        if user is not None:
            extra = RunAs(user=user["uid"], group=user["gid"], extra_groups=user["groups"])
        child = subprocess.Popen(  # noqa: S603 - an argv list, checked by the daemon
            list(launch["argv"]),
            executable=launch.get("executable"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=launch["cwd"],
            env=dict(launch["env"]),
            start_new_session=True,
            close_fds=True,
            preexec_fn=default_signals,  # the supervisor runs no other thread
            **extra,
        )
        for stream, pipe in (("stdout", child.stdout), ("stderr", child.stderr)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe, selectors.EVENT_READ, stream)
        return child

    def pump(self, timeout_s: float) -> None:
        """Copy whatever the pipes hold into the logs, waiting up to `timeout_s` for data."""
        if not self.selector.get_map():
            time.sleep(timeout_s)
            return
        for key, _ in self.selector.select(timeout_s):
            try:
                data = os.read(key.fd, READ_BYTES)
            except BlockingIOError:
                continue
            if not data:
                self.selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                continue
            if self.logs[key.data].write(data):
                caps = {s: log.capped for s, log in self.logs.items()}
                write_json_atomic(self.job_dir / "caps.json", caps)

    def reap(self) -> bool:
        """Reap every exited descendant; True once the job's own process has ended."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return self.status is not None
            if pid == 0:
                return self.status is not None
            if self.child is not None and pid == self.child.pid:
                self.status = status
                self.child.returncode = os.waitstatus_to_exitcode(status)

    def begin_end(self, ending: str, signal_name: str, grace_s: float) -> None:
        self.ending = ending
        self.ending_signal = signal_name
        self.signal_group(signal.Signals[signal_name])
        self.kill_deadline = time.monotonic() + max(grace_s, 0.0)

    def signal_group(self, sig: signal.Signals) -> None:
        assert self.child is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, sig)

    def finish_group(self) -> None:
        """After the job's main process ended: kill what is left of its group and of our
        descendants, reap them all, and drain the pipes."""
        self.signal_group(signal.SIGKILL)
        until = time.time() + REAP_S
        while time.time() < until:
            self.kill_descendants()
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break  # every descendant is reaped
            if pid == 0:
                time.sleep(POLL_S / 4)
        drain_until = time.time() + DRAIN_S
        while self.selector.get_map() and time.time() < drain_until:
            self.pump(POLL_S)
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        self.close_logs()

    def kill_descendants(self) -> None:
        """SIGKILL every child of ours (orphans re-parented to us that left the group)."""
        me = str(os.getpid())
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 1 and fields[1] == me:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def close_logs(self) -> None:
        for log in self.logs.values():
            log.close()

    def result(self, started_at: float) -> JobResultJson:
        assert self.status is not None
        code = os.waitstatus_to_exitcode(self.status)
        exit_code = code if code >= 0 else None
        died_of = signal.Signals(-code).name if code < 0 else None
        if self.ending is not None:
            state = self.ending
            reason = (
                f"killed with {self.ending_signal}"
                if state == "killed"
                else f"timed out after {self.launch.get('timeout_s')} s"
            )
        elif exit_code == 0:
            state, reason = "succeeded", None
        elif died_of is not None:
            state, reason = "failed", f"died of {died_of}"
        else:
            state, reason = "failed", f"exited with code {exit_code}"
        return {
            "state": state,
            "exit_code": exit_code,
            "signal": died_of,
            "reason": reason,
            "started_at": started_at,
            "ended_at": time.time(),
        }


def supervise(job_dir: Path) -> int:
    """Run the job of `job_dir` to its recorded end, unless another supervisor has it."""
    lock = take_lock(job_dir)
    if lock is None:
        return 0  # another supervisor runs this job
    if (job_dir / "supervisor.json").exists() or (job_dir / "result.json").exists():
        return 0  # this job was started before; never run it twice
    launch = read_json(job_dir / "launch.json")
    if launch is None:
        print(f"{job_dir}/launch.json is missing", file=sys.stderr)
        return 2
    become_subreaper()
    supervisor = Supervisor(job_dir, cast("LaunchJson", launch))
    result = supervisor.run()
    result["log_capped"] = {s: log.capped for s, log in supervisor.logs.items()}
    write_json_atomic(job_dir / "result.json", result)
    os.close(lock)
    return 0


def run_forked(job_dir: Path) -> None:
    """In a freshly forked process: detach the standard streams, supervise, never return."""
    code = 1
    try:
        log = os.open(job_dir / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        code = supervise(job_dir)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve_forks() -> int:
    """The fork server: for each job directory read from stdin (one per line), fork a detached
    supervisor (fork, setsid, fork again; the middle process is reaped at once). Started once
    by the daemon, it saves each job the interpreter's start-up; it exits at end of input (the
    daemon closed the pipe or died), and the supervisors it forked keep running."""
    for line in sys.stdin.buffer:
        job_dir = Path(line.decode("utf-8", "replace").rstrip("\n"))
        if not job_dir.is_absolute() or not job_dir.is_dir():
            print(f"fork server: not a job directory: {job_dir}", file=sys.stderr, flush=True)
            continue
        middle = os.fork()
        if middle == 0:
            try:
                os.setsid()
                if os.fork() == 0:
                    run_forked(job_dir)
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
    return 0


RESET_SIGNALS = (signal.SIGINT, signal.SIGQUIT)


def default_signals() -> None:
    """In a job's child before exec: SIGINT and SIGQUIT back to their default action. A daemon
    started with them ignored (under `nohup`, as a background job of a script) would hand the
    ignoring on through exec, and a job killed with SIGINT would then run on to the SIGKILL."""
    for number in RESET_SIGNALS:
        signal.signal(number, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1] == "--serve":
        return serve_forks()
    if len(argv) != 2:
        print("usage: supervise.py JOB_DIR | --serve", file=sys.stderr)
        return 2
    return supervise(Path(argv[1]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
