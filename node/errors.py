"""Exceptions of the node package, and its tables translating the errors underneath.

NodeError -- base of every error the node package raises; exit code 1 from a command
 +-- StartupError -- the daemon cannot start and the operator can fix it (exit code 2): a port
 |                   in use, a data dir that is a file, not writable, read-only or full, a record
 |                   store locked by another process
 +-- DiscoveryError -- mDNS could not start or a discovery source failed
 +-- MembershipError -- the membership protocol could not start (socket bind) or send
 |    +-- WireError -- a body that is not a valid membership message
 +-- ElectionError -- a malformed election message, or an elector used outside its lifecycle
 +-- PlanError -- a plan, fence or policy is malformed
 +-- GroupError -- a training process group could not be formed or re-formed
 |    +-- RendezvousError -- the daemon's /v1/rendezvous is unreachable, refused, or malformed
 |    +-- MasterUnreachable -- rank 0's store of a generation did not answer in time
 +-- LauncherError -- the training launcher was misused or given a rendezvous without a rank
 +-- PeerRequestError -- an HTTP request to a node failed; carries status (None: no answer)
      +-- PeerTimeoutError (also TimeoutError) -- no answer in time

`peer_error` translates aiohttp and OS errors of a request; `startup_error` translates what
stops a start (OSError, sqlite3, the WAL's and the record stores' errors) into a StartupError.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import aiohttp

from config import ErrorAnswer
from sync import StoreFullError, StoreLockedError, StoreWriteError, free_bytes, is_disk_full
from wal import WalError

__all__ = [
    "DiscoveryError",
    "ElectionError",
    "GroupError",
    "LauncherError",
    "MasterUnreachable",
    "MembershipError",
    "NodeError",
    "PeerRequestError",
    "PeerTimeoutError",
    "PlanError",
    "RendezvousError",
    "StartupError",
    "WireError",
    "data_dir_error",
    "peer_error",
    "startup_error",
]


class NodeError(Exception):
    """Base of every error the node package raises."""

    exit_code = 1


class StartupError(NodeError):
    """The daemon cannot start; the message names the thing and says what to fix."""

    exit_code = 2


class DiscoveryError(NodeError):
    """A discovery source (zeroconf, seeds) failed."""


class MembershipError(NodeError):
    """The membership protocol could not start or send."""


class WireError(MembershipError):
    """A body that is not a valid membership message."""


class ElectionError(NodeError):
    """A malformed election message, or an elector used outside its lifecycle."""


class PlanError(NodeError):
    """A plan, fence or policy is malformed (bad JSON from a peer, impossible bounds)."""


class GroupError(NodeError):
    """A process group could not be formed or re-formed; the message says which generation."""


class RendezvousError(GroupError):
    """The daemon's /v1/rendezvous is unreachable, refused, or malformed."""


class MasterUnreachable(GroupError):
    """Rank 0's store (master_addr:master_port) of a generation did not answer in time."""


class LauncherError(NodeError):
    """The launcher was misused (closed, no command) or given a rendezvous without a rank."""


class PeerRequestError(NodeError):
    """A request to `url` failed: no answer (`status` None) or an error answer, whose `reason`
    is the node's own words."""

    def __init__(self, url: str, reason: str, status: int | None = None) -> None:
        self.url = url
        self.reason = reason
        self.status = status
        where = url if status is None else f"{url}: HTTP {status}"
        super().__init__(f"{where}: {reason}")

    @classmethod
    def from_answer(cls, url: str, answer: ErrorAnswer) -> PeerRequestError:
        """The error of a node's error answer (config.read_error)."""
        return cls(url, f"{answer.reason} ({answer.code})", answer.status)


class PeerTimeoutError(PeerRequestError, TimeoutError):
    """A request to `url` got no answer in time."""


# --- the tables ---------------------------------------------------------------------------------


def peer_error(exc: BaseException, url: str) -> NodeError:
    """The NodeError for an error of aiohttp or the OS while requesting `url` (chain it)."""
    if isinstance(exc, NodeError):
        return exc
    if isinstance(exc, TimeoutError):
        return PeerTimeoutError(url, "no answer in time (timed out)")
    if isinstance(exc, aiohttp.ClientResponseError):
        return PeerRequestError(url, exc.message, exc.status)
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.strerror:
        return PeerRequestError(url, f"unreachable: {exc.os_error.strerror}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return PeerRequestError(url, f"unreachable: {exc or type(exc).__name__}")
    if isinstance(exc, ValueError):
        return PeerRequestError(url, f"not a JSON answer: {exc}")
    return PeerRequestError(url, f"{type(exc).__name__}: {exc}")


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
