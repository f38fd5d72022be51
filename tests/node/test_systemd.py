from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from node import SystemdNotifier


def _listener(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    return sock, path


def test_not_under_systemd_is_a_no_op() -> None:
    notifier = SystemdNotifier(env={})
    assert not notifier.enabled
    assert notifier.notify("READY=1") is False
    assert notifier.watchdog_s is None


def test_ready_status_and_stopping_are_sent(tmp_path: Path) -> None:
    sock, path = _listener(tmp_path)
    with sock:
        notifier = SystemdNotifier(env={"NOTIFY_SOCKET": path})
        notifier.ready("serving on 127.0.0.1:8770")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving on 127.0.0.1:8770"
        notifier.stopping()
        assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping"


def test_watchdog_interval_only_for_this_pid() -> None:
    env = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert SystemdNotifier(env=env).watchdog_s == 2.0
    assert SystemdNotifier(env={**env, "WATCHDOG_PID": "1"}).watchdog_s is None


async def test_watchdog_loop_pets_at_half_interval(tmp_path: Path) -> None:
    sock, path = _listener(tmp_path)
    sock.setblocking(False)
    with sock:
        notifier = SystemdNotifier(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})
        task = asyncio.create_task(notifier.watchdog_loop())
        await asyncio.sleep(0.12)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        received = []
        while True:
            try:
                received.append(sock.recv(64))
            except BlockingIOError:
                break
        assert len(received) >= 2
        assert set(received) == {b"WATCHDOG=1"}


def test_unreachable_socket_is_reported_not_raised(tmp_path: Path) -> None:
    notifier = SystemdNotifier(env={"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    assert notifier.notify("READY=1") is False
