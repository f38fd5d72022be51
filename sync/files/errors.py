"""The errors of file sync, re-exported: they live in sync.errors, under SyncError."""

from __future__ import annotations

from sync.errors import (
    AllSourcesFailedError,
    ContentMismatchError,
    FileChangedError,
    FileSyncError,
    FileTransferError,
    FileTransferTimeoutError,
    InsufficientSpaceError,
    ManifestError,
    PathRefusedError,
    SshAuthError,
    SshHostKeyError,
    TransferBusyError,
    UnknownCategoryError,
)

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
    "SshAuthError",
    "SshHostKeyError",
    "TransferBusyError",
    "UnknownCategoryError",
]
