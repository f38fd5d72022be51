"""One actor in a process of its own (started as a shoal job by the `shoal` backend): listens
on TCP with the worker servers' challenge, and serves every authenticated connection; calls of
all connections run one at a time, in arrival order per connection."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
from collections.abc import Sequence

from node.tasks.executor import TaskLoop
from node.workers import WorkerClosed, WorkerHandle, authenticate, load_secret
from node.workers.frames import FrameKind


class ActorHost:
    """The listening socket, the actor instance (built by the first `actor_new`) and a lock."""

    def __init__(self, host: str, port: int, secret: bytes | None) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(128)
        self.port: int = self.listener.getsockname()[1]
        self.secret = secret
        self.actors: dict[str, object] = {}
        self.lock = threading.Lock()

    def serve_forever(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        channel = authenticate(conn, self.secret)
        if channel is None:
            return
        try:
            channel.send_frame(FrameKind.READY, {"pid": os.getpid(), "host": socket.gethostname()})
            loop = TaskLoop(WorkerHandle(channel))
            loop.actors = self.actors
            while True:
                frame = loop.next_frame()
                with self.lock:
                    loop.run_one(frame)
        except (WorkerClosed, OSError, EOFError):
            pass
        finally:
            channel.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m node.tasks.actorhost")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--secret-file", default=None)
    args = parser.parse_args(argv)
    host = ActorHost(args.host, args.port, load_secret(args.secret_file))
    sys.stdout.write(json.dumps({"event": "listening", "host": args.host, "port": host.port}))
    sys.stdout.write("\n")
    sys.stdout.flush()
    host.serve_forever()


if __name__ == "__main__":
    main()
