"""The one table translating the errors of the libraries underneath sync (aiohttp, asyncssh,
sqlite3, the OS) to the most specific SyncError (sync.errors), chained.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

from net.errors import PeerRequestError
from sync.errors import (
    FileTransferError,
    FileTransferTimeoutError,
    RecordRequestError,
    RecordRequestTimeoutError,
    SshAuthError,
    SshHostKeyError,
    StoreFullError,
    StoreWriteError,
    SyncError,
)

__all__ = ["describe", "free_bytes", "is_disk_full", "sync_error", "translated"]

_SQLITE_FULL = 13
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
LIBRARY_ERRORS: tuple[type[BaseException], ...] = (
    PeerRequestError,
    aiohttp.ClientError,
    sqlite3.Error,
    OSError,
    TimeoutError,
)
"""What `translated` catches (asyncssh.Error too, once asyncssh is imported)."""


def is_disk_full(exc: BaseException) -> bool:
    """True when `exc` (or what it chains) says the disk or the quota is full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return True
        if isinstance(current, sqlite3.Error):
            code = getattr(current, "sqlite_errorcode", None)
            if (isinstance(code, int) and code & 0xFF == _SQLITE_FULL) or "is full" in str(current):
                return True
        current = current.__cause__ or current.__context__
    return False


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged process may still write on the filesystem of `path` (or its
    nearest existing parent); None when that cannot be read."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def describe(exc: BaseException) -> str:
    """`exc` as a short human phrase: its text, or its type when it has none (a peer request's
    failure: the reason, the caller's message names the peer)."""
    if isinstance(exc, PeerRequestError):
        return exc.reason if exc.status is None else f"HTTP {exc.status}: {exc.reason}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def _asyncssh_error(exc: BaseException, message: str) -> SyncError | None:
    asyncssh = sys.modules.get("asyncssh")
    if asyncssh is None or not isinstance(exc, asyncssh.Error):
        return None
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return SshHostKeyError(f"{message}: host key not verifiable: {exc}")
    if isinstance(exc, asyncssh.PermissionDenied):
        return SshAuthError(f"{message}: key refused: {exc}")
    return FileTransferError(f"{message}: {describe(exc)}")


def sync_error(
    exc: BaseException,
    message: str,
    kind: type[StoreWriteError] | type[RecordRequestError] | type[FileTransferError],
    *,
    path: Path | None = None,
) -> SyncError:
    """The most specific SyncError of family `kind` for an error of a library underneath.

    A full disk (ENOSPC, EDQUOT, SQLITE_FULL) at `path` is StoreFullError; a timeout is the
    family's timeout subclass; asyncssh's host key and auth refusals are SshHostKeyError and
    SshAuthError. The caller chains it (`raise ... from exc`). A SyncError is returned as is.
    """
    if isinstance(exc, SyncError):
        return exc
    if path is not None and is_disk_full(exc):
        return StoreFullError(path, free_bytes(path), message)
    ssh = _asyncssh_error(exc, message)
    if ssh is not None:
        return ssh
    text = f"{message}: {describe(exc)}"
    if isinstance(exc, TimeoutError):
        if issubclass(kind, RecordRequestError):
            return RecordRequestTimeoutError(f"{message}: timed out")
        if issubclass(kind, FileTransferError):
            return FileTransferTimeoutError(f"{message}: timed out")
    if issubclass(kind, RecordRequestError | FileTransferError):
        status = getattr(exc, "status", None)
        return kind(text, status if isinstance(status, int) else None)
    return kind(text)


@contextmanager
def translated(
    message: str,
    kind: type[StoreWriteError] | type[RecordRequestError] | type[FileTransferError],
    *,
    path: Path | None = None,
) -> Iterator[None]:
    """Raise `sync_error(exc, message, kind, path=path) from exc` for an error of aiohttp,
    asyncssh, sqlite3 or the OS inside the block (httpx's map_httpcore_exceptions, for sync)."""
    try:
        yield
    except SyncError:
        raise
    except Exception as exc:
        asyncssh = sys.modules.get("asyncssh")
        if not isinstance(exc, LIBRARY_ERRORS) and not (
            asyncssh is not None and isinstance(exc, asyncssh.Error)
        ):
            raise
        raise sync_error(exc, message, kind, path=path) from exc
