"""Local workers: `os.fork()` plus a socketpair (Heinrich's pattern). The caller sends JSON
messages (with optional raw payloads) and receives replies; a worker that dies is reported with
its exit code and the last lines of its stderr, within the caller's timeout."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from node.errors import WorkerClosed, WorkerDied, WorkerError, WorkerTimeout
from node.workers.frames import POLL_SLICE_S, Channel, Frame, FrameKind

STDERR_TAIL_LINES = 20
READY_TIMEOUT_S = 30.0
CLOSE_GRACE_S = 2.0

WorkFn = Callable[["WorkerHandle"], object]
W = TypeVar("W", bound="WorkerBase")


class WorkerHandle:
    """The worker's side of the channel, given to `work_fn(handle)`."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def send(self, message: Any, payload: bytes | None = None) -> None:
        self._channel.send_frame(FrameKind.MESSAGE, message, payload)

    def recv_frame(self, timeout_s: float | None = None) -> Frame:
        """The next message with its payload; WorkerClosed once the caller has gone."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        frame = self._channel.recv_frame(deadline)
        if frame is None:
            raise WorkerClosed("the caller closed the connection")
        return frame

    def recv(self, timeout_s: float | None = None) -> Any:
        return self.recv_frame(timeout_s).message


class WorkerBase:
    """What `Worker` and `RemoteWorker` share: framed send/recv with a bounded wait."""

    def __init__(self, channel: Channel, what: str) -> None:
        self._channel = channel
        self.what = what
        self._died: WorkerDied | None = None

    def fileno(self) -> int:
        return self._channel.fileno()

    def send(self, message: Any, payload: bytes | None = None) -> None:
        """Send one message (JSON-serialisable) with an optional raw payload."""
        if self._died is not None:
            raise self._died
        try:
            self._channel.send_frame(FrameKind.MESSAGE, message, payload)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self._death() from exc

    def recv(self, timeout_s: float | None = None) -> Any:
        """The next message; WorkerTimeout when none came within `timeout_s` (the worker is
        alive), WorkerDied when the worker ended (at once, never after a hang)."""
        return self.recv_frame(timeout_s).message

    def recv_frame(self, timeout_s: float | None = None) -> Frame:
        """Like `recv`, with the message's raw payload."""
        if self._died is not None:
            raise self._died
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WorkerTimeout(f"worker {self.what} sent nothing within {timeout_s} s")
            step = POLL_SLICE_S if left is None else min(POLL_SLICE_S, left)
            if self._channel.readable(step):
                break
            if self._exited():
                if self._channel.readable(0):
                    break
                raise self._death()
        try:
            frame = self._channel.recv_frame(None)
        except (EOFError, ConnectionResetError) as exc:
            raise self._death() from exc
        if frame is None:
            raise self._death()
        if frame.kind is FrameKind.DIED:
            message = frame.message if isinstance(frame.message, dict) else {}
            code = message.get("exit_code")
            self._died = WorkerDied(
                self.what, code if isinstance(code, int) else None, str(message.get("stderr", ""))
            )
            raise self._died
        return frame

    def _exited(self) -> bool:
        """Whether the worker is known to have ended without closing its channel."""
        return False

    def _death(self) -> WorkerDied:
        raise NotImplementedError

    def __enter__(self: W) -> W:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()


class Worker(WorkerBase):
    """A forked worker running `work_fn(handle)`; ready once the constructor returns."""

    def __init__(self, work_fn: WorkFn, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd, stderr_name = tempfile.mkstemp(prefix="shoal-worker-", suffix=".stderr")
        self.stderr_path = Path(stderr_name)
        self._exit_code: int | None = None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child never returns from here
            parent_sock.close()
            os.dup2(fd, 2)
            os.close(fd)
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - the child's
            _run_child(work_fn, child_sock)
        os.close(fd)
        child_sock.close()
        self.pid = pid
        super().__init__(Channel(parent_sock), f"pid {pid}")
        try:
            frame = self.recv_frame_raw(ready_timeout_s)
        except BaseException:
            self.close()
            raise
        if frame.kind is not FrameKind.READY:
            self.close()
            raise WorkerError(f"worker {self.what} sent {frame.kind.name} before READY")

    def recv_frame_raw(self, timeout_s: float) -> Frame:
        deadline = time.monotonic() + timeout_s
        while not self._channel.readable(POLL_SLICE_S):
            if self._exited() and not self._channel.readable(0):
                raise self._death()
            if time.monotonic() > deadline:
                raise WorkerTimeout(f"worker {self.what} was not ready within {timeout_s} s")
        frame = self._channel.recv_frame(None)
        if frame is None:
            raise self._death()
        return frame

    def raw_socket(self) -> socket.socket:
        """The parent's end of the socketpair (for a relay that forwards whole frames)."""
        return self._channel.sock

    def death(self) -> WorkerDied:
        """The WorkerDied of this (ended or ending) worker, after reaping it."""
        return self._death()

    @property
    def exit_code(self) -> int | None:
        """The exit code once the worker has ended (negative: the signal that killed it)."""
        self._exited()
        return self._exit_code

    def _exited(self) -> bool:
        if self._exit_code is not None:
            return True
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False
        self._exit_code = os.waitstatus_to_exitcode(status)
        return True

    def _reap(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._exited() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _death(self) -> WorkerDied:
        self._reap(CLOSE_GRACE_S)
        self._died = WorkerDied(self.what, self._exit_code, self.stderr_tail())
        return self._died

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self, keep_stderr: bool = False) -> None:
        """End the worker (SIGTERM, then SIGKILL after a grace) and release its channel; its
        stderr file is removed unless `keep_stderr`."""
        super().close()
        if not self._exited():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            self._reap(CLOSE_GRACE_S)
        if not self._exited():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._reap(CLOSE_GRACE_S)
        if not keep_stderr:
            with contextlib.suppress(OSError):
                self.stderr_path.unlink()


def _run_child(work_fn: WorkFn, sock: socket.socket) -> None:
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        channel = Channel(sock)
        channel.send_frame(FrameKind.READY, {"pid": os.getpid()})
        work_fn(WorkerHandle(channel))
    except WorkerClosed:
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    os._exit(code)


def wait_any(workers: Sequence[W], timeout_s: float | None = None) -> list[W]:
    """The workers whose `recv` will not block (a message is waiting, or the worker ended),
    waiting at most `timeout_s` for the first; [] when none became ready in time."""
    if not workers:
        return []
    ready, _, _ = select.select(list(workers), [], [], timeout_s)
    found = set(ready)
    return [worker for worker in workers if worker in found]
