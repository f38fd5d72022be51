"""A `shoal workers serve` child process for the remote worker tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECRET = b"workers-secret-0123456789abcdef0123"
ROOT = Path(__file__).resolve().parents[3]


def write_secret(directory: Path, secret: bytes = SECRET, name: str = "secret") -> Path:
    path = directory / name
    path.write_bytes(secret)
    path.chmod(0o600)
    return path


@dataclass
class ServedWorkers:
    port: int
    process: subprocess.Popen[str]


@contextlib.contextmanager
def worker_server(
    work_fn: str,
    secret_file: Path | None,
    workers: int = 2,
    env: dict[str, str] | None = None,
    stderr: Any = None,
) -> Iterator[ServedWorkers]:
    argv = [sys.executable, "-m", "node.cli", "workers", "serve", "--work-fn", work_fn]
    argv += ["--workers", str(workers)]
    if secret_file is not None:
        argv += ["--secret-file", str(secret_file)]
    child_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=child_env,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        event = json.loads(line)
        assert event["event"] == "listening", line
        yield ServedWorkers(int(event["port"]), process)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
