"""Last-resort cleanup of live clusters: at interpreter exit and on SIGTERM or SIGINT."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Protocol

__all__ = ["register", "unregister"]


class _Closable(Protocol):
    def close(self) -> None: ...


_live: dict[int, _Closable] = {}
_owner_pid = os.getpid()
_atexit_installed = False
_previous: dict[int, object] = {}


def register(cluster: _Closable) -> None:
    """Close `cluster` at exit or on SIGTERM/SIGINT unless it was unregistered first."""
    _install()
    _live[id(cluster)] = cluster


def unregister(cluster: _Closable) -> None:
    _live.pop(id(cluster), None)


def close_all() -> None:
    """Close every registered cluster; a forked child never closes its parent's clusters."""
    if os.getpid() != _owner_pid:
        return
    for cluster in list(_live.values()):
        with contextlib.suppress(Exception):  # go on with the next cluster
            cluster.close()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    close_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)  # SIGINT: Python's default handler raises KeyboardInterrupt
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install() -> None:
    global _atexit_installed, _owner_pid
    if not _atexit_installed or _owner_pid != os.getpid():
        _atexit_installed = True
        _owner_pid = os.getpid()
        _live.clear()  # a forked child starts with none of its parent's clusters
        atexit.register(close_all)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still runs
    for signum in (signal.SIGTERM, signal.SIGINT):
        current = signal.getsignal(signum)
        if current is _on_signal or current == signal.SIG_IGN or current is None:
            continue
        _previous[signum] = current
        signal.signal(signum, _on_signal)
