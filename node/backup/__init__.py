"""Backup and restore of a node: a consistent snapshot of a running daemon as one verified
archive (`POST /v1/backup`, `shoal backup`), restored with every byte checked first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.backup.archive import (
        MANIFEST_NAME,
        Manifest,
        Member,
        VerifiedArchive,
        manifest_summary,
        verify_archive,
    )
    from node.backup.restore import RestoreResult, restore_archive
    from node.backup.service import BACKUP_PATH, BackupService
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
