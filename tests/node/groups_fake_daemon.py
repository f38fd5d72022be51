"""A fake local daemon for process-group tests: a controllable GET /v1/rendezvous in a thread."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from config import AuthError, NonceCache, verify_request
from node.training.rendezvous import RENDEZVOUS_PATH, Rendezvous

Answer = Rendezvous | tuple[int, object] | bytes
"""A rendezvous (200), (status, JSON body), or raw bytes sent with 200."""
AnswerOf = Answer | Callable[[int], Answer]
"""An answer, or the answer for each local rank (the request's ?local_rank=, default 0)."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class FakeDaemon:
    """Serves `answer` at /v1/rendezvous on 127.0.0.1:0; checks signatures when given a secret.
    `paths` lists the paths asked for, query included."""

    def __init__(self, answer: AnswerOf, secret: bytes | None = None) -> None:
        self.answer = answer
        self.secret = secret
        self.requests = 0
        self.paths: list[str] = []
        self.refused: list[str] = []
        self._nonces = NonceCache()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> FakeDaemon:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _respond(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        parts = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(parts.query)
        with self._lock:
            self.requests += 1
            self.paths.append(path)
            if parts.path != RENDEZVOUS_PATH:
                return 404, json.dumps({"error": f"no route {path}"}).encode()
            if self.secret is not None:
                try:
                    verify_request(
                        self.secret, headers, method, path, b"", self._nonces, time.time()
                    )
                except AuthError as exc:
                    self.refused.append(exc.reason)
                    return 401, json.dumps({"error": exc.reason, "status": 401}).encode()
            answer = self.answer
        if callable(answer):
            answer = answer(int(query.get("local_rank", ["0"])[0]))
        if isinstance(answer, Rendezvous):
            return 200, json.dumps(answer.to_dict()).encode()
        if isinstance(answer, bytes):
            return 200, answer
        status, body = answer
        return status, json.dumps(body).encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        daemon = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = daemon._respond("GET", self.path, dict(self.headers.items()))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
