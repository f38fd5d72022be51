"""Exceptions of file sync; all derive from sync.errors.SyncError.

SyncError
 +-- FileSyncError -- base of file sync errors; aiohttp and OSError errors are chained
      +-- PathRefusedError (also ValueError) -- a relative path is absolute, escapes, or is bad
      +-- UnknownCategoryError (also LookupError) -- not a file category of this node
      +-- ManifestError -- a peer's manifest (or one entry of it) is malformed or inconsistent
      +-- InsufficientSpaceError -- a transfer would leave less free space than the reserve
      +-- TransferBusyError -- another transfer holds the partial file of the same content
      +-- ContentMismatchError -- received bytes did not hash to what the manifest promised
      +-- FileChangedError -- the peer no longer has that version (HTTP 412 or 404)
      +-- FileTransferError -- network failure or unexpected answer; carries status (or None)
      +-- AllSourcesFailedError -- every peer (and transport) failed; carries each error
"""

from __future__ import annotations

from collections.abc import Sequence

from sync.errors import SyncError

__all__ = [
    "AllSourcesFailedError",
    "ContentMismatchError",
    "FileChangedError",
    "FileSyncError",
    "FileTransferError",
    "InsufficientSpaceError",
    "ManifestError",
    "PathRefusedError",
    "TransferBusyError",
    "UnknownCategoryError",
]


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
