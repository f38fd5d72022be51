from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

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


async def test_watchdog_loop_pets_at_half_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pet is followed by a wait of exactly half of WATCHDOG_USEC: the interval itself is
    checked (a loop petting at the full interval fails), not a count after a sleep."""
    sock, path = _listener(tmp_path)
    sock.setblocking(False)
    waits: list[float] = []
    pets_before_wait: list[int] = []
    received: list[bytes] = []
    real_sleep = asyncio.sleep

    def drain() -> None:
        while True:
            try:
                received.append(sock.recv(64))
            except BlockingIOError:
                return

    async def recording_sleep(delay: float) -> None:
        drain()
        waits.append(delay)
        pets_before_wait.append(len(received))
        if len(waits) == 3:
            raise asyncio.CancelledError
        await real_sleep(0)

    with sock:
        notifier = SystemdNotifier(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"})
        monkeypatch.setattr("node.systemd.asyncio.sleep", recording_sleep)
        with pytest.raises(asyncio.CancelledError):
            await notifier.watchdog_loop()
    assert waits == [1.5, 1.5, 1.5]
    assert pets_before_wait == [1, 2, 3], "one WATCHDOG=1 before each wait"
    assert set(received) == {b"WATCHDOG=1"}


async def test_watchdog_loop_without_watchdog_returns_at_once() -> None:
    notifier = SystemdNotifier(env={"NOTIFY_SOCKET": "/x"})
    async with asyncio.timeout(1):
        await notifier.watchdog_loop()


def test_unreachable_socket_is_reported_not_raised(tmp_path: Path) -> None:
    notifier = SystemdNotifier(env={"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    assert notifier.notify("READY=1") is False
