"""One `shoal serve` in a child process with every surface an attacker reaches: `auth: hmac+tls`
(signed plain HTTP and TLS on one port), a dashboard token (the login), a cluster secret; for
the budget tests and bench/flood_bench.py, which measure its RSS and its signed answers."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.node.tls_pki import Pki, make_pki

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"budget-test-secret-0123456789abcdef"
TOKEN = "budget-test-ui-token-0123456789abcdef"
NODE = "a"
START_S = 90.0
SETTLE_READINGS = 5
SETTLE_INTERVAL_S = 0.2
SETTLE_BYTES = 2 * 1024 * 1024
SETTLE_S = 60.0


@dataclass(frozen=True)
class Served:
    """The daemon's process, port and PKI (a client certificate for TLS clients)."""

    process: subprocess.Popen[bytes]
    port: int
    pki: Pki


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _private(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=2) as answer:
            return int(answer.status) in (200, 503)
    except urllib.error.HTTPError as exc:
        return exc.code == 503
    except OSError:
        return False


@contextlib.contextmanager
def served_daemon(root: Path) -> Iterator[Served]:
    """The daemon, stopped (SIGTERM, then SIGKILL) at the end; its log in ROOT/daemon.log."""
    pki = make_pki(root / "pki", nodes=(NODE,))
    config = {
        "secret_file": str(_private(root / "secret", SECRET)),
        "ui_token_file": str(_private(root / "ui-token", TOKEN.encode())),
        "auth": "hmac+tls",
        "tls": pki.node_tls(NODE),
    }
    config_file = root / "node.yaml"
    config_file.write_text(json.dumps(config))
    port = _free_port()
    argv = [sys.executable, "-m", "node", "serve", "--config", str(config_file)]
    argv += ["--node-id", NODE, "--data-dir", str(root / "data"), "--port", str(port)]
    argv += ["--no-mdns", "--bind", "127.0.0.1"]
    log = root / "daemon.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=out)
    try:
        started = time.monotonic()
        while not _healthy(port):
            if process.poll() is not None or time.monotonic() - started > START_S:
                raise AssertionError(f"the daemon did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield Served(process, port, pki)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def settled_rss_bytes(pid: int) -> int:
    """The RSS of `pid` once SETTLE_READINGS readings in a row are within SETTLE_BYTES."""
    readings: list[int] = []
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        readings.append(rss_bytes(pid))
        window = readings[-SETTLE_READINGS:]
        if len(window) == SETTLE_READINGS and max(window) - min(window) <= SETTLE_BYTES:
            return window[-1]
        time.sleep(SETTLE_INTERVAL_S)
    shown = [f"{r / 2**20:.1f}" for r in readings[-SETTLE_READINGS:]]
    raise AssertionError(f"the daemon's RSS never settled: last readings {shown} MiB")
