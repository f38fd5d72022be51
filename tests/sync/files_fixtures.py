"""Test helpers of file sync: a node (catalog, routes on a real server, HTTP transport,
coordinator, optional WAL) in one object, and small file utilities."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from config import DeletionPolicy, Timeouts
from health import BreakerConfig, BreakerRegistry
from sync import (
    FileCatalog,
    HttpTransport,
    MountInfo,
    PeerRef,
    SpaceReserve,
    SyncCoordinator,
    SyncOptions,
    Transport,
    file_routes,
)
from sync.files.engine import FenceHeaders
from sync.files.manifest import digest_of_fd
from wal import WalConfig, WriteAheadLog

PIECE = 16 << 10
CATEGORIES = ("models", "training", "configs")
FAST_TIMEOUTS = Timeouts(http_request_s=2.0, sync_s=20.0, sync_piece_s=5.0)
NO_RESERVE = SpaceReserve(0, 0.0)
LOCAL_MOUNTS = (MountInfo("/dev/test", "/", "ext4"),)


class CountingHasher:
    """The real hasher, counting its calls (to prove a listing did not hash)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fd: int, piece_size: int) -> tuple[int, str, tuple[str, ...]]:
        self.calls += 1
        return digest_of_fd(fd, piece_size)


def write_file(path: Path, data: bytes, mtime_ns: int | None = None) -> Path:
    """Write `data` at `path` atomically (temp + rename), optionally with a given mtime."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"tmp-{os.urandom(4).hex()}")
    temp.write_bytes(data)
    if mtime_ns is not None:
        os.utime(temp, ns=(mtime_ns, mtime_ns))
    os.replace(temp, path)
    return path


def hash_file(path: str | os.PathLike[str], piece_size: int) -> tuple[int, str, tuple[str, ...]]:
    """(size, hash, piece hashes) of a file, as a manifest entry holds them (the product hashes
    open files: digest_of_fd)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return digest_of_fd(fd, piece_size)
    finally:
        os.close(fd)


def content_hash_of(path: Path, piece_size: int = PIECE) -> str:
    return hash_file(path, piece_size)[1]


def internal_files(root: Path) -> list[str]:
    """Relative paths of every .shoal- file under `root`."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            if name.startswith(".shoal-"):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(found)


class FileNode:
    """One node of file sync for tests (async context manager): every category under `base`,
    its routes on a real 127.0.0.1 server, an HTTP transport, a coordinator, maybe a WAL."""

    def __init__(
        self,
        base: Path,
        node_id: str,
        *,
        piece_size: int = PIECE,
        with_wal: bool = False,
        breakers: BreakerRegistry | None = None,
        options: SyncOptions | None = None,
        mounts: tuple[MountInfo, ...] = LOCAL_MOUNTS,
        hasher: Callable[[int, int], tuple[int, str, tuple[str, ...]]] = digest_of_fd,
        transport_options: Mapping[str, Any] | None = None,
        transports: Callable[[HttpTransport], Mapping[str, Transport]] | None = None,
        fence: FenceHeaders | None = None,
        upload_limit_bytes_s: float | None = None,
        deletions: Mapping[str, DeletionPolicy] | None = None,
        clock: Callable[[], int] = time.time_ns,
        tombstone_ttl_s: float = 3600.0,
    ) -> None:
        self.base = base
        self._upload_limit = upload_limit_bytes_s
        self.node_id = node_id
        roots = {category: base / "data" / category for category in CATEGORIES}
        self.catalog = FileCatalog(
            roots,
            base / "cache",
            piece_size=piece_size,
            mounts=mounts,
            hasher=hasher,
            listing_fresh_s=0.0,
            scan_interval_factor=0.0,
            deletions=deletions,
            node_id=node_id,
            tombstone_ttl_s=tombstone_ttl_s,
            clock=clock,
        )
        self.wal = WriteAheadLog(base / "wal.db", config=WalConfig(quick_check_on_open=False))
        self._with_wal = with_wal
        self.breakers = breakers or BreakerRegistry(BreakerConfig(failure_threshold=3))
        self.options = options or SyncOptions(
            timeouts=FAST_TIMEOUTS, retries=2, retry_delay_s=0.01, reserve=NO_RESERVE
        )
        self.http = HttpTransport(
            node_id=node_id, timeouts=FAST_TIMEOUTS, **dict(transport_options or {})
        )
        self._transports = transports
        self._fence = fence
        self._stack = contextlib.AsyncExitStack()
        self.server: TestServer | None = None
        self.coordinator: SyncCoordinator | None = None
        self.peer = PeerRef(node_id, "http://127.0.0.1:9")

    async def __aenter__(self) -> FileNode:
        try:
            await self._stack.enter_async_context(self.catalog)
            if self._with_wal:
                await self._stack.enter_async_context(self.wal)
            await self._stack.enter_async_context(self.http)
            app = web.Application()
            app.router.add_routes(
                file_routes(self.catalog, self._pull, upload_limit_bytes_s=self._upload_limit)
            )
            self.server = TestServer(app, host="127.0.0.1", port=0)
            await self.server.start_server()
            self._stack.push_async_callback(self.server.close)
            self.peer = PeerRef(self.node_id, str(self.server.make_url("")).rstrip("/"))
            extra = self._transports(self.http) if self._transports else None
            self.coordinator = SyncCoordinator(
                self.catalog,
                self.http,
                self_peer=self.peer,
                wal=self.wal if self._with_wal else None,
                breakers=self.breakers,
                options=self.options,
                transports=extra,
                fence=self._fence,
            )
            await self._stack.enter_async_context(self.coordinator)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def _pull(self, category: str, path: str, digest: str, source: PeerRef) -> Any:
        assert self.coordinator is not None
        return await self.coordinator.pull_file(category, path, digest, source)

    @property
    def sync(self) -> SyncCoordinator:
        assert self.coordinator is not None
        return self.coordinator

    @property
    def port(self) -> int:
        assert self.server is not None
        assert self.server.port is not None
        return self.server.port

    def root(self, category: str = "models") -> Path:
        return self.catalog.root(category)

    def write(self, rel: str, data: bytes, category: str = "models", **kw: Any) -> Path:
        return write_file(self.root(category).joinpath(*rel.split("/")), data, **kw)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)
