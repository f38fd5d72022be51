"""Starting supervisors: through a fork server (one `supervise.py --serve` process the daemon
keeps, which forks a detached supervisor per job), or by spawning the script directly when the
fork server is not available. Either way the supervisor is not a child of the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from config import JobSettings
from node.jobs.filetypes import LaunchJson
from node.jobs.policy import RunAs, job_env
from node.jobs.records import gang_env
from node.jobs.store import JobEntry
from node.jobs.supervise import __file__ as SUPERVISOR_FILE

log = logging.getLogger(__name__)

SUPERVISOR = Path(SUPERVISOR_FILE).resolve()
CLOSE_WAIT_S = 5.0


def supervisor_argv(*args: str) -> list[str]:
    """`python -I -S supervise.py ARGS`: isolated, without site (the script is stdlib only)."""
    return [sys.executable, "-I", "-S", str(SUPERVISOR), *args]


def spawn_supervisor(directory: Path) -> subprocess.Popen[bytes]:
    """Spawn the supervisor of the job in `directory` in its own session (the caller reaps
    it). Its output: supervisor.log."""
    with (directory / "supervisor.log").open("ab") as out:
        return subprocess.Popen(  # noqa: S603 - fixed argv of our own script
            supervisor_argv(str(directory)),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
        )


def make_cwd(entry: JobEntry) -> tuple[Path, list[Path]]:
    """The working directory of `entry` and the directories made for it (to give the job's
    user): `work/` and a relative cwd inside it, made one segment at a time, never through a
    symlink nor above `work/`; an absolute cwd is neither made nor given. PermissionError
    naming the path otherwise (the start fails; the request check refuses `..` already)."""
    work = entry.work_dir
    work.mkdir(exist_ok=True)
    given = entry.request.cwd
    if given is not None and Path(given).is_absolute():
        return Path(given), []
    current = work
    for part in Path(given or ".").parts:
        if part == "..":
            raise PermissionError(f"cwd {given!r} of job {entry.job_id} leaves its work directory")
        current = current / part
        with contextlib.suppress(FileExistsError):
            current.mkdir()  # (refuses a name that exists, a symlink included: checked below)
        if current.is_symlink() or not current.is_dir():
            raise PermissionError(
                f"cwd {given!r} of job {entry.job_id}: {current} is not a directory of its own "
                "(a symlink or a file)"
            )
    return current, [work] if current == work else [work, current]


def launch_document(
    entry: JobEntry,
    executable: str | None,
    extra_env: Mapping[str, str],
    *,
    settings: JobSettings,
    run_as: RunAs | None,
    daemon_url: str,
    base_env: Mapping[str, str],
) -> LaunchJson:
    """What the supervisor needs to run `entry` (launch.json); makes the job's private tmp
    directory and its working directory (owned by `run_as` when given)."""
    tmp = entry.directory / "tmp"
    tmp.mkdir(mode=0o700, exist_ok=True)
    cwd, made = make_cwd(entry)
    if run_as is not None:
        for path in [tmp, *made]:
            os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)
    shoal = {
        "SHOAL_JOB_ID": entry.job_id,
        "SHOAL_DAEMON_URL": daemon_url,
        **extra_env,
        **gang_env(entry.request.gang),
    }
    # The job's own TMPDIR: a private /tmp of the service is removed on restart, the job
    # directory is not.
    base = {**base_env, "TMPDIR": str(tmp)}
    env = job_env(entry.request, base=base, rendezvous={}, shoal=shoal, run_as=run_as)
    return {
        "argv": list(entry.request.argv),
        "executable": executable,
        "env": env,
        "cwd": str(cwd),
        "timeout_s": entry.request.timeout_s,
        "kill_grace_s": settings.kill_grace_s,
        "max_log_bytes": settings.max_log_bytes,
        "user": run_as.to_launch() if run_as is not None else None,
    }


class ForkServer:
    """The daemon's fork server process. `submit()` returns False when it is gone (the caller
    then spawns the supervisor itself); `close()` ends it (supervisors keep running)."""

    def __init__(self, log_path: Path) -> None:
        self._log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self._log_path.open("ab") as out:
            self._process = subprocess.Popen(  # noqa: S603 - fixed argv of our own script
                supervisor_argv("--serve"),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
            )

    def submit(self, job_dir: Path) -> bool:
        """Ask for a supervisor of `job_dir`; False when the fork server cannot take it."""
        process = self._process
        if process is None or process.stdin is None or process.poll() is not None:
            return False
        try:
            process.stdin.write(f"{job_dir}\n".encode())
            process.stdin.flush()
        except OSError as exc:
            log.warning("jobs: the fork server is gone (%s); spawning supervisors directly", exc)
            return False
        return True

    async def close(self) -> None:
        """End the fork server (end of its input) and reap it. Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError):  # a fork server that died leaves a broken pipe
                process.stdin.close()
        try:
            await asyncio.to_thread(process.wait, CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)
