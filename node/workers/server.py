"""`WorkerServer`: listens on TCP, authenticates each connection, forks a worker per connection
running `work_fn(handle)` and relays frames between them; when the worker ends it tells the
caller its exit code and the last lines of its stderr."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import select
import shutil
import signal
import socket
import sys
import time
from types import FrameType

from node.errors import WorkerError
from node.workers.auth import is_loopback, new_nonce, verify
from node.workers.frames import POLL_SLICE_S, Channel, FrameKind, encode_frame, split_frames
from node.workers.local import Worker, WorkFn

log = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 10.0
STOP_GRACE_S = 3.0
BUSY_GRACE_S = 5.0
"""How long a connection over capacity waits for a session to end before it is refused."""
RELAY_CHUNK_BYTES = 1 << 20


def load_work_fn(spec: str) -> WorkFn:
    """The function `module:function` (or miniray's `module.function`) names; WorkerError
    saying what is wrong otherwise."""
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        raise WorkerError(f"--work-fn {spec!r}: expected module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkerError(f"--work-fn {spec!r}: cannot import {module_name}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise WorkerError(f"--work-fn {spec!r}: {module_name} has no function {attr}")
    result: WorkFn = fn
    return result


class WorkerServer:
    """A listening socket and the sessions (one forked process per connection) it serves."""

    def __init__(
        self,
        work_fn: WorkFn,
        host: str = "127.0.0.1",
        port: int = 0,
        max_workers: int = 1,
        secret: bytes | None = None,
    ) -> None:
        if secret is None and not is_loopback(host):
            raise WorkerError(
                f"worker server on {host}: without a secret it may listen on loopback only; "
                "pass --secret-file with the cluster secret"
            )
        if max_workers < 1:
            raise WorkerError(f"--workers must be at least 1, got {max_workers}")
        self.work_fn = work_fn
        self.secret = secret
        self.max_workers = max_workers
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
        except OSError as exc:
            self._listener.close()
            raise WorkerError(f"worker server cannot listen on {host}:{port}: {exc}") from exc
        self._listener.listen(64)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self.sessions: set[int] = set()
        self._stopping = False

    def stop(self) -> None:
        """Ask `serve_forever` to end (safe from a signal handler)."""
        self._stopping = True

    def serve_forever(self) -> None:
        """Accept and serve until `stop()` (or SIGTERM/SIGINT, when run on the main thread)."""
        try:
            while not self._stopping:
                self._reap()
                ready, _, _ = select.select([self._listener], [], [], POLL_SLICE_S * 4)
                if ready:
                    self._accept()
        finally:
            self.close()

    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _accept(self) -> None:
        try:
            conn, peer = self._listener.accept()
        except OSError:
            return
        if self.secret is None and not is_loopback(str(peer[0])):
            _refuse(conn, "not_loopback", f"{peer[0]} is not loopback and there is no secret")
            return
        deadline = time.monotonic() + BUSY_GRACE_S
        self._reap()
        while len(self.sessions) >= self.max_workers and time.monotonic() < deadline:
            time.sleep(0.01)  # a refused or closed session may be exiting right now
            self._reap()
        if len(self.sessions) >= self.max_workers:
            _refuse(conn, "busy", f"all {self.max_workers} workers of this server are in use")
            return
        pid = os.fork()
        if pid == 0:
            self._listener.close()
            code = 0
            try:
                run_session(conn, self.work_fn, self.secret)
            except SystemExit:
                code = 0
            except BaseException:
                log.exception("worker session failed")
                code = 1
            os._exit(code)
        conn.close()
        self.sessions.add(pid)

    def _reap(self) -> None:
        for pid in list(self.sessions):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.sessions.discard(pid)

    def close(self) -> None:
        """Stop listening and end every session and its worker. Idempotent."""
        self._listener.close()
        for pid in self.sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.sessions and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.02)
        for pid in self.sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while self.sessions:
            self._reap()
            time.sleep(0.01)


def _refuse(conn: socket.socket, code: str, reason: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(encode_frame(FrameKind.REFUSED, {"error": code, "reason": reason}))
    conn.close()


def authenticate(conn: socket.socket, secret: bytes | None) -> Channel | None:
    """Challenge the caller on `conn`; its channel once it answered right, else None (the
    caller was told why and the connection is closed)."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    channel = Channel(conn)
    nonce = new_nonce()
    try:
        channel.send_frame(
            FrameKind.CHALLENGE,
            {"nonce": nonce.hex(), "auth": "hmac-sha256" if secret else "none"},
        )
        frame = channel.recv_frame(time.monotonic() + AUTH_TIMEOUT_S)
    except (OSError, EOFError, WorkerError):
        channel.close()
        return None
    given = frame.message.get("mac") if frame and isinstance(frame.message, dict) else None
    if frame is None or frame.kind is not FrameKind.AUTH or not verify(secret, nonce, given):
        _refuse(conn, "auth_failed", "wrong or missing cluster secret")
        return None
    return channel


def run_session(conn: socket.socket, work_fn: WorkFn, secret: bytes | None) -> None:
    """One connection: challenge, check the answer, fork the worker, say READY, relay frames;
    a DIED frame when the worker ends; the worker is ended when the caller goes away."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    channel = authenticate(conn, secret)
    if channel is None:
        return
    worker = Worker(work_fn)
    stopping: list[int] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        # A flag the relay reads, not an exception: one raised while the session ends would
        # cut the copy of the worker's stderr into the job's log short.
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        channel.send_frame(FrameKind.READY, {"pid": worker.pid, "host": socket.gethostname()})
        _relay(conn, worker, stopping)
    finally:
        worker.close(keep_stderr=True)
        _copy_stderr(worker)
        channel.close()


def _copy_stderr(worker: Worker) -> None:
    """Put what the worker wrote on stderr into the server's stderr (the job's log)."""
    try:
        with worker.stderr_path.open("rb") as source:
            shutil.copyfileobj(source, sys.stderr.buffer)
        sys.stderr.flush()
        worker.stderr_path.unlink()
    except OSError:
        pass


def _relay(conn: socket.socket, worker: Worker, stopping: list[int]) -> None:
    """Frames both ways until either end goes or a SIGTERM arrives (`stopping`)."""
    inner = worker.raw_socket()
    pending = bytearray()
    while not stopping:
        ready, _, _ = select.select([conn, inner], [], [], POLL_SLICE_S)
        if conn in ready:
            data = _recv(conn)
            if not data:
                return  # the caller went away: the finally of run_session ends the worker
            try:
                inner.sendall(data)
            except OSError:
                _report_death(conn, worker)
                return
        if inner in ready:
            data = _recv(inner)
            if not data:
                _report_death(conn, worker)
                return
            pending.extend(data)
            for raw in split_frames(pending):
                conn.sendall(raw)
        elif not ready and worker.exit_code is not None:
            _report_death(conn, worker)
            return


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(RELAY_CHUNK_BYTES)
    except OSError:
        return b""


def _report_death(conn: socket.socket, worker: Worker) -> None:
    died = worker.death()
    message: dict[str, int | str | None] = {
        "exit_code": died.exit_code,
        "stderr": died.stderr_tail,
    }
    with contextlib.suppress(OSError):
        conn.sendall(encode_frame(FrameKind.DIED, message))
