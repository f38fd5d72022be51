"""The steps every transport shares: the locked resumable partial file, verification of the
pieces already in it, the final verify, fsync, atomic rename and fsync of the directory, and
worker-thread jobs that survive cancellation of their caller.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from config import fsync_directory
from sync.errors import (
    ContentMismatchError,
    FileSyncError,
    PathRefusedError,
    TransferBusyError,
)
from sync.files.manifest import ManifestEntry, digest_of_fd, hash_fd
from sync.guards import partial_name

logger = logging.getLogger(__name__)

T = TypeVar("T")

_UNLOCKABLE = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range  # libc is loaded
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _sync_file_range()


def start_writeback(fd: int, offset: int, count: int) -> None:
    """Ask the kernel to start writing `count` bytes at `offset` of `fd` to disk now, without
    waiting for it (sync_file_range WRITE), so the fsync before the rename finds little left
    to flush. Best effort: where the call is missing or fails, the fsync does it all."""
    if _SYNC_FILE_RANGE is not None and count > 0:
        _SYNC_FILE_RANGE(fd, offset, count, SYNC_FILE_RANGE_WRITE)


class PartialFile:
    """The resumable partial file of one content hash, open read-write and exclusively locked
    (flock) so two transfers never write it together. Blocking methods; call from a thread."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, directory: Path, content_hash: str) -> PartialFile:
        """Open (creating) and lock `directory`/.shoal-partial-<hash>; TransferBusyError when
        another transfer holds it."""
        path = directory / partial_name(content_hash)
        for _ in range(8):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                _lock(fd, path)
                if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    return cls(path, fd)
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # renamed into place by the transfer we waited for: open afresh
        raise TransferBusyError(f"{path}: replaced repeatedly while opening")

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        """Close (and so unlock) the file; idempotent."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def discard(self) -> None:
        """Delete the partial file (its content cannot be used) and close it."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            self.close()


def _lock(fd: int, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise TransferBusyError(f"{path}: another transfer is writing this file") from exc
    except OSError as exc:
        if exc.errno not in _UNLOCKABLE:
            raise
        logger.debug("%s: flock not supported here (%s); continuing unlocked", path, exc)


async def settle_all(jobs: Sequence[asyncio.Future[Any]]) -> None:
    """Wait until worker-thread jobs have really finished, even through cancellation: they use
    a descriptor the caller is about to close. A cancellation meanwhile is re-raised after."""
    cancelled = False
    for job in jobs:
        while not job.done():
            try:
                await asyncio.wait([job])
            except asyncio.CancelledError:
                cancelled = True
        if not job.cancelled():
            job.exception()  # retrieved: the caller reports the first failure itself
    if cancelled:
        raise asyncio.CancelledError


async def await_jobs(jobs: Sequence[asyncio.Future[T]]) -> list[T]:
    """The results of worker-thread jobs, raising the first failure only once all finished;
    cancelling the caller never abandons a running job (see settle_all)."""
    try:
        return [await asyncio.shield(job) for job in jobs]
    finally:
        await settle_all(jobs)


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a worker thread, cancellation-safe like await_jobs."""
    job: asyncio.Future[T] = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    return (await await_jobs([job]))[0]


async def open_partial(directory: Path, content_hash: str) -> PartialFile:
    """PartialFile.open in a worker thread; closed again if the caller is cancelled meanwhile,
    so the lock is never left held."""
    job = asyncio.get_running_loop().run_in_executor(
        None, PartialFile.open, directory, content_hash
    )
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await settle_all([job])
        if not job.cancelled() and job.exception() is None:
            job.result().close()
        raise


def verify_present_pieces(fd: int, entry: ManifestEntry) -> list[bool]:
    """Which pieces of `entry` the partial file already holds intact (hashed again here, never
    trusted). Cuts the file to `entry.size` if it is longer. Blocking."""
    size = os.fstat(fd).st_size
    if size > entry.size:
        os.ftruncate(fd, entry.size)
        size = entry.size
    expected = entry.piece_hashes()
    verified = [False] * entry.piece_count
    for index in range(entry.piece_count):
        offset, length = entry.piece_span(index)
        if offset + length > size or (length == 0 and entry.size > 0):
            continue
        _, digests = hash_fd(fd, entry.piece_size, offset, length)
        verified[index] = digests[0].hex() == expected[index]
    return verified


def make_directories(root: Path, directory: Path) -> None:
    """Create `directory` (inside `root`) and its missing parents, each made durable by an
    fsync of its parent; PathRefusedError when a symlink on the way leads outside `root`.
    Blocking."""
    root.mkdir(parents=True, exist_ok=True)
    root_real = os.path.realpath(root)
    missing: list[Path] = []
    current = directory
    while current != root and not current.is_dir():
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise FileSyncError(f"{path} exists and is not a directory") from None
            continue
        fsync_directory(path.parent)
    real = os.path.realpath(directory)
    if real != root_real and not real.startswith(root_real.rstrip("/") + "/"):
        raise PathRefusedError(str(directory), "a symlink leads outside the category root")


def install_file(
    temp_path: Path,
    final_path: Path,
    entry: ManifestEntry,
    fd: int | None = None,
    verified: bool = False,
) -> os.stat_result:
    """Put a fully written temp (or partial) file in place of `final_path`. Blocking.

    Unless `verified` (every piece was checked as it arrived), hashes the file first; on a
    mismatch the temp file is deleted and ContentMismatchError raised. Then: cut to size,
    set mtime to `entry.mtime_ns`, fsync, rename atomically over the final path, fsync the
    directory. Uses `fd` when the caller holds the file open (and locked). Returns its stat.
    """
    own_fd = fd is None
    handle = os.open(temp_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW) if fd is None else fd
    try:
        if not verified:
            size, digest, _ = digest_of_fd(handle, entry.piece_size)
            if size != entry.size or digest != entry.hash:
                os.unlink(temp_path)
                raise ContentMismatchError(
                    f"{entry.path}: received {size} bytes hashing to {digest[:16]}, expected "
                    f"{entry.size} bytes hashing to {entry.hash[:16]}"
                )
        elif os.fstat(handle).st_size != entry.size:
            os.ftruncate(handle, entry.size)
        os.utime(handle, ns=(time.time_ns(), entry.mtime_ns))
        os.fsync(handle)
        os.replace(temp_path, final_path)
        fsync_directory(final_path.parent)
        return os.fstat(handle)
    finally:
        if own_fd:
            os.close(handle)
