"""systemd notify protocol: READY=1, STATUS=, WATCHDOG=1 from the event loop, STOPPING=1."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends sd_notify datagrams when run under systemd (NOTIFY_SOCKET set); a no-op otherwise."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._address = env.get("NOTIFY_SOCKET") or None
        self._watchdog_s = self._watchdog_interval(env)
        self._warned = False

    @staticmethod
    def _watchdog_interval(env: Mapping[str, str]) -> float | None:
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        if not usec or not usec.isdigit() or int(usec) == 0:
            return None
        if pid and pid.isdigit() and int(pid) != os.getpid():
            return None
        return int(usec) / 1_000_000

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_s(self) -> float | None:
        """The watchdog interval systemd asked for, or None."""
        return self._watchdog_s

    def notify(self, *lines: str) -> bool:
        """Send `lines` (like "READY=1") in one datagram; False when not under systemd."""
        if self._address is None:
            return False
        address = self._address
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(address)
                sock.sendall("\n".join(lines).encode())
        except OSError as exc:
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            log.log(level, "systemd notify to %s failed: %s", self._address, exc)
            return False
        return True

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.notify(f"STATUS={status}")

    def stopping(self) -> None:
        self.notify("STOPPING=1", "STATUS=stopping")

    async def watchdog_loop(self) -> None:
        """Pet the watchdog at half its interval, from the event loop, until cancelled."""
        if self._watchdog_s is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self._watchdog_s / 2)
