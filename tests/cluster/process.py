"""A child process of the harness: its own process group, output captured to a log file."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.cluster.cluster import Host

__all__ = ["ClusterProcess", "tail"]

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the harness dies (even by SIGKILL), so does
    # the child. Survives the exec of `ip netns exec` and of the command it runs.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file ("" if it does not exist)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


class ClusterProcess:
    """One spawned command: session and process group of its own, stdout+stderr to `log_path`.

    Signals go to the whole process group, so children of the command get them too.
    """

    def __init__(
        self,
        host: Host,
        command: Sequence[str],
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        log_path: Path,
        cwd: Path | None,
    ) -> None:
        self.host = host
        self.argv = tuple(argv)
        self.log_path = log_path
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # PDEATHSIG fires when the spawning *thread* exits, so only set it from the main thread.
        in_main_thread = threading.current_thread() is threading.main_thread()
        with log_path.open("ab") as log:
            self.popen: subprocess.Popen[bytes] = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent if in_main_thread else None,
            )

    def __repr__(self) -> str:
        return f"<ClusterProcess {self.host.name} pid={self.pid} rc={self.popen.returncode}>"

    @property
    def pid(self) -> int:
        """Process id of the command (also its process group id)."""
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Exit status once reaped (negative signal number if killed by a signal), else None."""
        return self.popen.poll()

    def running(self) -> bool:
        """True while the command has not exited (a stopped process is still running)."""
        return self.popen.poll() is None

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the process group; a group that is already gone is ignored."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self) -> None:
        """SIGSTOP the group: the process freezes, its sockets stay open (a hung peer)."""
        self.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT the group after `stop()`."""
        self.send_signal(signal.SIGCONT)

    def is_stopped(self) -> bool:
        """True if the process is in the stopped state (after SIGSTOP)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rpartition(")")[2].split()[0] in {"T", "t"}

    def wait(self, timeout_s: float = 10.0) -> int:
        """Wait for exit and return the exit status; raises `subprocess.TimeoutExpired`."""
        return self.popen.wait(timeout=timeout_s)

    def kill(self, timeout_s: float = 10.0) -> int:
        """SIGKILL the group (a crash) and reap the process; returns its status (-9)."""
        self.send_signal(signal.SIGKILL)
        return self.wait(timeout_s)

    def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM the group (a graceful stop), SIGKILL it after `timeout_s`; returns the status."""
        self.send_signal(signal.SIGCONT)
        self.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return self.kill()

    def log_text(self) -> str:
        """Everything the process wrote so far (stdout and stderr interleaved)."""
        return self.log_path.read_bytes().decode("utf-8", errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the process log."""
        return tail(self.log_path, lines)
