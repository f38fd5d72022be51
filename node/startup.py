"""Start-up: the API's port must be free, the data dir must exist, be a directory and take a
durable write; and the table turning what stops a start (OSError, sqlite3, WAL and record store
errors) into a StartupError."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sqlite3
from pathlib import Path

from node.errors import MembershipError, StartupError
from sync import StoreFullError, StoreLockedError, StoreWriteError, free_bytes, is_disk_full
from wal import WalError

__all__ = [
    "check_port_free",
    "data_dir_error",
    "listen_sockets",
    "prepare_data_dir",
    "startup_error",
]

PROBE_BYTES = 64 * 1024
"""What the probe writes: a data dir without room for this cannot hold a WAL page either."""


def check_port_free(bind: str, port: int) -> None:
    """Raise StartupError (one line: the address, why, what to do) when `bind`:`port` cannot
    take the API's TCP listener or membership's UDP socket; nothing is opened before this, so a
    busy port stops the start with no store, WAL or log line. Port 0 (any free port) passes.
    The listeners are bound again later: a port taken in between is still reported then."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return  # an unresolvable address: the listener's own bind says so
    for family, _, _, _, address in infos:
        for kind, name in ((socket.SOCK_STREAM, "the API (TCP)"), (socket.SOCK_DGRAM, "UDP")):
            try:
                with socket.socket(family, kind) as probe:
                    if kind == socket.SOCK_STREAM:  # as asyncio's listener binds it
                        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        if family == socket.AF_INET6:
                            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    probe.bind(address)
            except OSError as exc:
                raise _port_error(exc, bind, port, name) from exc


def listen_sockets(bind: str, port: int, backlog: int = 128) -> list[socket.socket]:
    """The API's listening TCP sockets on `bind`:`port`, bound before anything else is built
    (membership's UDP socket takes the same number): one per address `bind` resolves to, all
    on one port (port 0: the first address's free port). StartupError (one line) when one
    cannot be bound; none is left open then."""
    try:
        infos = socket.getaddrinfo(
            bind or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise _port_error(exc, bind, port, "the API (TCP)") from exc
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if bound[1:]:  # the same port on every address
                address = (address[0], bound[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError as exc:
        for sock in bound:
            sock.close()
        raise _port_error(exc, bind, port, "the API (TCP)") from exc
    return bound


def _port_error(exc: OSError, bind: str, port: int, name: str) -> StartupError:
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    if name == "UDP":
        return StartupError(
            f"cannot bind membership UDP on {bind}:{port}: {why}; membership uses UDP on the "
            "API's port number: stop what holds that UDP port or choose another --port"
        )
    return StartupError(
        f"cannot listen on {bind}:{port}: {why}; is another shoal running? choose another --port"
    )


def prepare_data_dir(data_dir: Path) -> None:
    """Create `data_dir` and prove it takes a durable write, or raise StartupError whose one line
    says which: a file in the way, not writable, read-only, or a full disk."""
    try:
        if data_dir.exists() and not data_dir.is_dir():
            raise StartupError(
                f"data dir {data_dir} is a file, not a directory; move it away or choose another "
                "--data-dir"
            )
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise data_dir_error(exc, data_dir) from exc
    probe = data_dir / f".shoal-write-probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = memoryview(b"\0" * PROBE_BYTES)
            while data:  # a short write means the disk filled: the next one says ENOSPC
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise data_dir_error(exc, data_dir, free_bytes(data_dir)) from exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _os_error(exc: BaseException, codes: frozenset[int]) -> OSError | None:
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in codes:
            return link
    return None


_PORT_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})
_DIR_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.ENOENT}
)
_FIX_DIR = "or choose another --data-dir"


def data_dir_error(exc: OSError, data_dir: Path, free_bytes: int | None = None) -> StartupError:
    """The one line for an OSError met while preparing or writing `data_dir`."""
    where = exc.filename or data_dir
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = "unknown" if free_bytes is None else str(free_bytes)
        return StartupError(
            f"data dir {data_dir}: the disk is full ({free} bytes free); free space there "
            f"{_FIX_DIR}"
        )
    if code == errno.EROFS:
        return StartupError(
            f"data dir {data_dir} is read-only (a read-only file system); remount it read-write "
            f"{_FIX_DIR}"
        )
    if code in (errno.EACCES, errno.EPERM):
        return StartupError(
            f"data dir {data_dir} is not writable ({where}: permission denied); fix its owner "
            f"or mode {_FIX_DIR}"
        )
    if code in (errno.ENOTDIR, errno.EEXIST):
        return StartupError(
            f"data dir {data_dir}: {where} is a file, not a directory; move it away {_FIX_DIR}"
        )
    return StartupError(f"data dir {data_dir}: {where}: {exc.strerror or exc}; {_FIX_DIR}")


def startup_error(exc: BaseException, data_dir: Path) -> StartupError | None:
    """The StartupError (exit 2, one line) for a start-up failure the operator can fix, or None.

    The table: StartupError as is; a record store locked by another process; a full disk
    (ENOSPC, EDQUOT, SQLITE_FULL); a port in use (the API's TCP or membership's UDP port); the
    data dir not writable, read-only or a file (OSError or a read-only SQLite database).
    """
    if isinstance(exc, StartupError):
        return exc
    if isinstance(exc, StoreLockedError):
        return StartupError(str(exc))
    if isinstance(exc, StoreFullError) or is_disk_full(exc):
        free = exc.free_bytes if isinstance(exc, StoreFullError) else free_bytes(data_dir)
        return data_dir_error(OSError(errno.ENOSPC, "No space left on device"), data_dir, free)
    if isinstance(exc, MembershipError) and _os_error(exc, _PORT_ERRNOS) is not None:
        return StartupError(
            f"{exc}; membership uses UDP on the API's port number: stop what holds that UDP "
            "port or choose another --port"
        )
    if isinstance(exc, OSError | WalError | StoreWriteError):
        os_error = _os_error(exc, _DIR_ERRNOS)
        if os_error is not None:
            return data_dir_error(os_error, data_dir)
        if _read_only_sqlite(exc):
            return StartupError(
                f"data dir {data_dir}: a database cannot be written ({exc}); the data dir is "
                f"read-only or not writable: fix its permissions or mount {_FIX_DIR}"
            )
    return None


def _read_only_sqlite(exc: BaseException) -> bool:
    return any(
        isinstance(link, sqlite3.Error)
        and ("readonly" in str(link) or "unable to open" in str(link))
        for link in _chain(exc)
    )
