"""Exceptions of the sync package (sync.translate maps the errors underneath to them).

SyncError -- base of every error raised by sync; sqlite3, aiohttp, asyncssh and OSError errors are
 |           translated by sync.translate's `sync_error` / `translated` and chained
 +-- RecordSchemaError (also ValueError) -- a record store schema is declared wrongly
 +-- RecordValidationError (also ValueError) -- one record broke its schema: index, field, message
 +-- RecordQueryError (also ValueError) -- a query parameter is bad; `param` names it
 +-- UnknownStoreError (also LookupError) -- no record store of that name
 +-- StoreClosedError -- the record store is closed or closing
 +-- StoreBusyError -- the store's queue stayed full for max_wait_s; carries retry_after_s
 +-- StoreWriteError -- SQLite failed to open, write or read a record store
 |    +-- StoreFullError -- the disk is full: carries path and free_bytes (HTTP 507)
 |    +-- StoreLockedError -- another process holds the store's lock file
 +-- SnapshotError -- a snapshot could not be written, or is corrupt or of another schema
 +-- RecordRequestError -- a request to a node's record endpoints failed; carries status
 |    +-- RecordRequestTimeoutError (also TimeoutError) -- no answer in time
 |    +-- RecordRejectedError -- the node refused the records (400, 404, 413); never retried
 +-- RecordPullError -- a pull stopped partway; `result` says what was committed and where to resume
 +-- FileSyncError -- base of file sync errors
      +-- PathRefusedError (also ValueError) -- a relative path is absolute, escapes, or is bad
      +-- UnknownCategoryError (also LookupError) -- not a file category of this node
      +-- ManifestError -- a peer's manifest (or one entry of it) is malformed or inconsistent
      +-- InsufficientSpaceError -- a transfer would leave less free space than the reserve
      +-- TransferBusyError -- another transfer holds the partial file of the same content
      +-- ContentMismatchError -- received bytes did not hash to what the manifest promised
      +-- FileChangedError -- the peer no longer has that version (HTTP 412 or 404)
      +-- FileTransferError -- network failure or unexpected answer; carries status (or None)
      |    +-- FileTransferTimeoutError (also TimeoutError) -- no answer in time
      |    +-- SshHostKeyError -- the peer's SSH host key is unknown or changed
      |    +-- SshAuthError -- the peer's SSH server refused the client key
      +-- AllSourcesFailedError -- every peer (and transport) failed; carries each error
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sync.records.cursor import PullResult

__all__ = [
    "AllSourcesFailedError",
    "ContentMismatchError",
    "FileChangedError",
    "FileSyncError",
    "FileTransferError",
    "FileTransferTimeoutError",
    "InsufficientSpaceError",
    "ManifestError",
    "PathRefusedError",
    "RecordPullError",
    "RecordQueryError",
    "RecordRejectedError",
    "RecordRequestError",
    "RecordRequestTimeoutError",
    "RecordSchemaError",
    "RecordValidationError",
    "SnapshotError",
    "SshAuthError",
    "SshHostKeyError",
    "StoreBusyError",
    "StoreClosedError",
    "StoreFullError",
    "StoreLockedError",
    "StoreWriteError",
    "SyncError",
    "TransferBusyError",
    "UnknownCategoryError",
    "UnknownStoreError",
]


class SyncError(Exception):
    """Base of every error the sync package raises."""


class RecordSchemaError(SyncError, ValueError):
    """A RecordSchema or FieldSpec is invalid; the message names the store and field."""


class RecordValidationError(SyncError, ValueError):
    """Record `index` of a request broke its schema at `field` ("" for the record itself).

    str() is the reason sent to the client, e.g. `records[17].num_players: expected integer`.
    """

    def __init__(self, index: int | None, field: str, message: str) -> None:
        self.index = index
        self.field = field
        self.message = message
        where = "records" if index is None else f"records[{index}]"
        if field:
            where = f"{where}.{field}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[type[RecordValidationError], tuple[int | None, str, str]]:
        return (type(self), (self.index, self.field, self.message))


class RecordQueryError(SyncError, ValueError):
    """The query parameter `param` is bad; str() is `param: what is wrong`."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        self.message = message
        super().__init__(f"{param}: {message}")

    def __reduce__(self) -> tuple[type[RecordQueryError], tuple[str, str]]:
        return (type(self), (self.param, self.message))


class UnknownStoreError(SyncError, LookupError):
    """There is no record store called `store`."""

    def __init__(self, store: str) -> None:
        self.store = store
        super().__init__(f"unknown record store {store!r}")

    def __reduce__(self) -> tuple[type[UnknownStoreError], tuple[str]]:
        return (type(self), (self.store,))


class StoreClosedError(SyncError):
    """The record store is closed (or closing) and takes no more work."""


class StoreBusyError(SyncError):
    """The store's queue of pending records stayed full; retry in `retry_after_s` seconds."""

    def __init__(self, store: str, retry_after_s: float) -> None:
        self.store = store
        self.retry_after_s = max(0.0, retry_after_s)
        super().__init__(
            f"record store {store!r} is busy (queue full); retry in {self.retry_after_s:g} s"
        )

    def __reduce__(self) -> tuple[type[StoreBusyError], tuple[str, float]]:
        return (type(self), (self.store, self.retry_after_s))


class BacklogFullError(SyncError):
    """A store holds `cap` unconsumed records of `group` already; retry in `retry_after_s`
    seconds, when the consumer has read some (HTTP 429)."""

    def __init__(
        self, store: str, group: str, pending: int, cap: int, retry_after_s: float
    ) -> None:
        self.store, self.group, self.pending, self.cap = store, group, pending, cap
        self.retry_after_s = max(0.0, retry_after_s)
        super().__init__(
            f"record store {store!r} holds {pending} unconsumed records of {group!r} "
            f"(at most {cap}); retry in {self.retry_after_s:g} s, once the consumer has read some"
        )

    def __reduce__(self) -> tuple[type[BacklogFullError], tuple[str, str, int, int, float]]:
        return (type(self), (self.store, self.group, self.pending, self.cap, self.retry_after_s))


class StoreWriteError(SyncError):
    """SQLite failed to open, write or read a record store; nothing of the failed batch is kept."""


class StoreFullError(StoreWriteError):
    """The filesystem of `path` is full (`free_bytes` left); nothing of the failed batch is kept.

    `doing` says what failed, e.g. `/data/games/games.db: cannot commit`.
    """

    def __init__(self, path: Path | str, free_bytes: int | None, doing: str) -> None:
        self.path = Path(path)
        self.free_bytes = free_bytes
        self.doing = doing
        free = "unknown" if free_bytes is None else str(free_bytes)
        super().__init__(
            f"{doing}: the disk is full ({free} bytes free); free space there and writes "
            "resume by themselves"
        )

    def __reduce__(self) -> tuple[type[StoreFullError], tuple[Path, int | None, str]]:
        return (type(self), (self.path, self.free_bytes, self.doing))


class StoreLockedError(StoreWriteError):
    """Another process holds the lock file of the store at `path`."""

    def __init__(self, path: Path | str, lock_path: Path | str) -> None:
        self.path = Path(path)
        self.lock_path = Path(lock_path)
        super().__init__(
            f"{self.path}: locked by another process (lock file {self.lock_path}); is another "
            "shoal running with this data dir? stop it or choose another --data-dir"
        )

    def __reduce__(self) -> tuple[type[StoreLockedError], tuple[Path, Path]]:
        return (type(self), (self.path, self.lock_path))


class SnapshotError(SyncError):
    """A snapshot could not be written, or a file to merge is corrupt or of another schema."""


class RecordRequestError(SyncError):
    """A request to a node's record endpoints failed (network, timeout or an unexpected status).

    `status` is the HTTP status, or None when no response arrived.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)

    def __reduce__(self) -> tuple[type[RecordRequestError], tuple[str, int | None]]:
        return (type(self), (str(self), self.status))


class RecordRequestTimeoutError(RecordRequestError, TimeoutError):
    """A request to a node's record endpoints got no answer in time."""


class RecordRejectedError(RecordRequestError):
    """The node refused the records with `reason` (400 invalid, 404 unknown store, 413 too large).

    `index` and `field` name the offending record when the node said which; never retried.
    """

    def __init__(
        self, reason: str, status: int, index: int | None = None, field: str | None = None
    ) -> None:
        self.reason = reason
        self.index = index
        self.field = field
        super().__init__(reason, status)

    def __reduce__(  # type: ignore[override]
        self,
    ) -> tuple[type[RecordRejectedError], tuple[str, int, int | None, str | None]]:
        return (type(self), (self.reason, self.status or 0, self.index, self.field))


class RecordPullError(SyncError):
    """A pull failed partway; `result` counts what was committed and holds the resume cursor."""

    def __init__(self, message: str, result: PullResult) -> None:
        self.result = result
        super().__init__(message)


class FileSyncError(SyncError):
    """Base of the errors of file sync (manifests, transports, the coordinator)."""


class PathRefusedError(FileSyncError, ValueError):
    """`path` is not a plain relative path inside its category root; `reason` says why."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"path {path!r} refused: {reason}")

    def __reduce__(self) -> tuple[type[PathRefusedError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


class UnknownCategoryError(FileSyncError, LookupError):
    """`category` is not one of this node's file categories."""

    def __init__(self, category: str) -> None:
        self.category = category
        super().__init__(f"unknown file category {category!r}")

    def __reduce__(self) -> tuple[type[UnknownCategoryError], tuple[str]]:
        return (type(self), (self.category,))


class ManifestError(FileSyncError):
    """A manifest page or entry is malformed, or its piece hashes do not add up to its hash."""


class InsufficientSpaceError(FileSyncError):
    """Writing `needed_bytes` would leave less than `reserve_bytes` free in `directory`."""

    def __init__(
        self, directory: str, needed_bytes: int, free_bytes: int, reserve_bytes: int
    ) -> None:
        self.directory = directory
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.reserve_bytes = reserve_bytes
        super().__init__(
            f"{directory}: {needed_bytes} bytes needed, {free_bytes} free, "
            f"{reserve_bytes} must stay free"
        )

    def __reduce__(self) -> tuple[type[InsufficientSpaceError], tuple[str, int, int, int]]:
        return (
            type(self),
            (self.directory, self.needed_bytes, self.free_bytes, self.reserve_bytes),
        )


class TransferBusyError(FileSyncError):
    """Another transfer (in this or another process) is writing the same partial file."""


class ContentMismatchError(FileSyncError):
    """Bytes from `peer` did not match the expected hash (piece `piece`, or None: whole file)."""

    def __init__(self, message: str, peer: str = "", piece: int | None = None) -> None:
        self.peer = peer
        self.piece = piece
        super().__init__(message)

    def __reduce__(self) -> tuple[type[ContentMismatchError], tuple[str, str, int | None]]:
        return (type(self), (str(self), self.peer, self.piece))


class FileChangedError(FileSyncError):
    """The peer refused: the file changed (412, `current_hash` is its hash now) or is gone (404)."""

    def __init__(self, message: str, status: int, current_hash: str | None = None) -> None:
        self.status = status
        self.current_hash = current_hash
        super().__init__(message)

    def __reduce__(self) -> tuple[type[FileChangedError], tuple[str, int, str | None]]:
        return (type(self), (str(self), self.status, self.current_hash))


class FileTransferError(FileSyncError):
    """A request to a peer failed: no answer (`status` None) or an unexpected status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)

    def __reduce__(self) -> tuple[type[FileTransferError], tuple[str, int | None]]:
        return (type(self), (str(self), self.status))


class FileTransferTimeoutError(FileTransferError, TimeoutError):
    """A request to a peer got no answer (or no more bytes) in time."""


class SshHostKeyError(FileTransferError):
    """The peer's SSH host key is unknown or differs from its known_hosts entry."""


class SshAuthError(FileTransferError):
    """The peer's SSH server refused the client key."""


class AllSourcesFailedError(FileSyncError):
    """No source delivered the file; `errors` holds (peer, error) in the order tried."""

    def __init__(self, path: str, errors: Sequence[tuple[str, BaseException]]) -> None:
        self.path = path
        self.errors = tuple(errors)
        tried = "; ".join(f"{peer}: {error}" for peer, error in self.errors) or "no sources"
        super().__init__(f"{path}: every source failed ({tried})")

    @property
    def only_changed(self) -> bool:
        """True when every source answered that it no longer has this version."""
        return bool(self.errors) and all(
            isinstance(error, FileChangedError) for _, error in self.errors
        )
