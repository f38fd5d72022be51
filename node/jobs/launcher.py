"""Starting supervisors: through a fork server (one `supervise.py --serve` process the daemon
keeps, which forks a detached supervisor per job), or by spawning the script directly when the
fork server is not available. Either way the supervisor is not a child of the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
from pathlib import Path

from node.jobs.supervise import __file__ as SUPERVISOR_FILE

log = logging.getLogger(__name__)

SUPERVISOR = Path(SUPERVISOR_FILE).resolve()
CLOSE_WAIT_S = 5.0


def supervisor_argv(*args: str) -> list[str]:
    """`python -I -S supervise.py ARGS`: isolated, without site (the script is stdlib only)."""
    return [sys.executable, "-I", "-S", str(SUPERVISOR), *args]


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
