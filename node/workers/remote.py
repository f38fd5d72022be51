"""`RemoteWorker`: a worker on a `WorkerServer` over TCP, with the same API as `Worker`. The
constructor returns once the server has authenticated it and the worker runs."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from node.errors import WorkerAuthError, WorkerDied, WorkerError, WorkerTimeout
from node.workers.auth import answer, load_secret
from node.workers.frames import Channel, Frame, FrameKind
from node.workers.local import READY_TIMEOUT_S, WorkerBase

CONNECT_TIMEOUT_S = 10.0


class RemoteWorker(WorkerBase):
    """One worker process on `host:port`, authenticated with the secret in `secret_file` (or
    `secret`); WorkerAuthError when the server refuses, WorkerError when it cannot be reached."""

    def __init__(
        self,
        host: str,
        port: int,
        secret_file: str | Path | None = None,
        *,
        secret: bytes | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        key = secret if secret is not None else load_secret(secret_file)
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as exc:
            raise WorkerError(
                f"cannot connect to the worker server at {host}:{port}: {exc}; is "
                "`shoal workers serve` running there?"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().__init__(Channel(sock), f"{host}:{port}")
        self.pid: int | None = None
        try:
            self._handshake(key, ready_timeout_s)
        except BaseException:
            self._channel.close()
            raise

    def _handshake(self, secret: bytes | None, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        challenge = self._expect(FrameKind.CHALLENGE, deadline)
        nonce = bytes.fromhex(str(challenge.message.get("nonce", "")))
        if challenge.message.get("auth") == "hmac-sha256" and secret is None:
            raise WorkerAuthError(
                f"worker server {self.what} needs the cluster secret; pass secret_file="
            )
        self._channel.send_frame(FrameKind.AUTH, {"mac": answer(secret, nonce)})
        ready = self._expect(FrameKind.READY, deadline)
        pid = ready.message.get("pid")
        self.pid = pid if isinstance(pid, int) else None

    def _expect(self, kind: FrameKind, deadline: float) -> Frame:
        try:
            frame = self._channel.recv_frame(deadline)
        except WorkerTimeout as exc:
            raise WorkerTimeout(
                f"worker server {self.what} sent no {kind.name} in time; is it a shoal worker "
                "server, and not overloaded?"
            ) from exc
        except (EOFError, OSError) as exc:
            raise WorkerError(f"worker server {self.what} closed the connection: {exc}") from exc
        if frame is None:
            raise WorkerError(f"worker server {self.what} closed the connection")
        if frame.kind is FrameKind.REFUSED:
            message = frame.message if isinstance(frame.message, dict) else {}
            error_class = WorkerAuthError if message.get("error") != "busy" else WorkerError
            raise error_class(
                f"worker server {self.what} refused the connection: {message.get('reason')}"
            )
        if frame.kind is FrameKind.DIED:
            code = frame.message.get("exit_code")
            raise WorkerDied(
                self.what, code if isinstance(code, int) else None, frame.message.get("stderr", "")
            )
        if frame.kind is not kind or not isinstance(frame.message, dict):
            raise WorkerError(f"worker server {self.what} sent {frame.kind.name}, not {kind.name}")
        return frame

    def _death(self) -> WorkerDied:
        self._died = WorkerDied(self.what, None, "")
        return self._died
