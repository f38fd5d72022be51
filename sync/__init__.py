"""Sync between nodes: record stores (games, rollouts) with durable ingestion and peer pulls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from sync.cluster import cluster_stats_from_json, full_cluster_sync
    from sync.errors import (
        AllSourcesFailedError,
        BacklogFullError,
        ContentMismatchError,
        FileChangedError,
        FileSyncError,
        FileTransferError,
        FileTransferTimeoutError,
        InsufficientSpaceError,
        ManifestError,
        PathRefusedError,
        RecordPullError,
        RecordQueryError,
        RecordRejectedError,
        RecordRequestError,
        RecordRequestTimeoutError,
        RecordSchemaError,
        RecordValidationError,
        SnapshotError,
        SshAuthError,
        SshHostKeyError,
        StoreBusyError,
        StoreClosedError,
        StoreFullError,
        StoreLockedError,
        StoreWriteError,
        SyncError,
        TransferBusyError,
        UnknownCategoryError,
        UnknownStoreError,
    )
    from sync.files.catalog import CHECKPOINTS, FILE_CATEGORIES, FileCatalog
    from sync.files.download import RateLimiter
    from sync.files.engine import SyncCoordinator, SyncOptions
    from sync.files.manifest import DEFAULT_PIECE_SIZE, ManifestEntry, ManifestPage
    from sync.files.manifest_cache import Listing, ManifestCache
    from sync.files.piece_routes import PieceHandlers, piece_routes
    from sync.files.pieces import Limits, PieceBook, PieceMap, choose_pieces
    from sync.files.plan import (
        ClusterSyncStats,
        FallbackSources,
        NodeSyncStats,
        PullItem,
        RecordSyncStats,
        SyncStats,
        plan_pulls,
    )
    from sync.files.routes import FileHandlers, file_routes
    from sync.files.tombstones import Tombstone, TombstoneStore, plan_deletions
    from sync.guards import SpaceReserve, check_raw_query_value, open_inside, validate_rel_path
    from sync.records.client import RecordClient, parse_retry_after, retry_delay_s
    from sync.records.fallback import GamesPull, P2PFallbackSync
    from sync.records.pull import P2PSyncClient, fetch_page, pull_records
    from sync.records.registry import RecordStores
    from sync.records.routes import RecordHandlers, record_routes
    from sync.records.schema import (
        BUILTIN_SCHEMAS,
        GAMES_SCHEMA,
        ROLLOUTS_SCHEMA,
        FieldKind,
        FieldSpec,
        RecordSchema,
        schema_from_mapping,
    )
    from sync.records.store import RecordStore
    from sync.records.types import (
        Cursor,
        IngestResult,
        PullResult,
        RecordPage,
        SinceQuery,
        SnapshotInfo,
        StoreOptions,
        StoreStatus,
        parse_since_query,
    )
    from sync.records.validate import row_to_record, validate_records
    from sync.storage import (
        MountInfo,
        StorageCapabilities,
        StorageKind,
        StorageProvider,
        detect_storage,
        provider_of,
    )
    from sync.translate import free_bytes, is_disk_full, sync_error, translated
    from sync.transports.http import HttpTransport, RemoteManifest
    from sync.transports.partial import (
        PartialFile,
        install_file,
        make_directories,
        open_partial,
        verify_present_pieces,
    )
    from sync.transports.protocol import PeerRef, TransferResult, Transport
    from sync.transports.rsync import RsyncTransport, SshTarget
    from sync.transports.ssh_relay import SshConnector, SshRelay
    from sync.transports.swarm import SwarmOptions, SwarmTransport
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "sync.cluster": "cluster_stats_from_json full_cluster_sync",
            "sync.errors": (
                "AllSourcesFailedError BacklogFullError ContentMismatchError FileChangedError "
                "FileSyncError FileTransferError FileTransferTimeoutError "
                "InsufficientSpaceError ManifestError PathRefusedError RecordPullError "
                "RecordQueryError RecordRejectedError RecordRequestError RecordRequestTimeoutError "
                "RecordSchemaError RecordValidationError SnapshotError SshAuthError "
                "SshHostKeyError StoreBusyError "
                "StoreClosedError StoreFullError StoreLockedError StoreWriteError SyncError "
                "TransferBusyError UnknownCategoryError UnknownStoreError"
            ),
            "sync.files.catalog": "CHECKPOINTS FILE_CATEGORIES FileCatalog",
            "sync.files.download": "RateLimiter",
            "sync.files.engine": "SyncCoordinator SyncOptions",
            "sync.files.manifest": "DEFAULT_PIECE_SIZE ManifestEntry ManifestPage",
            "sync.files.manifest_cache": "Listing ManifestCache",
            "sync.files.piece_routes": "PieceHandlers piece_routes",
            "sync.files.pieces": "Limits PieceBook PieceMap choose_pieces",
            "sync.files.plan": (
                "ClusterSyncStats FallbackSources NodeSyncStats PullItem RecordSyncStats SyncStats "
                "plan_pulls"
            ),
            "sync.files.routes": "FileHandlers file_routes",
            "sync.files.tombstones": "Tombstone TombstoneStore plan_deletions",
            "sync.guards": "SpaceReserve check_raw_query_value open_inside validate_rel_path",
            "sync.records.client": "RecordClient parse_retry_after retry_delay_s",
            "sync.records.fallback": "GamesPull P2PFallbackSync",
            "sync.records.pull": "P2PSyncClient fetch_page pull_records",
            "sync.records.registry": "RecordStores",
            "sync.records.routes": "RecordHandlers record_routes",
            "sync.records.schema": (
                "BUILTIN_SCHEMAS GAMES_SCHEMA ROLLOUTS_SCHEMA FieldKind FieldSpec RecordSchema "
                "schema_from_mapping"
            ),
            "sync.records.store": "RecordStore",
            "sync.records.types": (
                "Cursor IngestResult PullResult RecordPage SinceQuery SnapshotInfo StoreOptions "
                "StoreStatus parse_since_query"
            ),
            "sync.records.validate": "row_to_record validate_records",
            "sync.storage": (
                "MountInfo StorageCapabilities StorageKind StorageProvider detect_storage "
                "provider_of"
            ),
            "sync.translate": "free_bytes is_disk_full sync_error translated",
            "sync.transports.http": "HttpTransport RemoteManifest",
            "sync.transports.partial": (
                "PartialFile install_file make_directories open_partial verify_present_pieces"
            ),
            "sync.transports.protocol": "PeerRef TransferResult Transport",
            "sync.transports.rsync": "RsyncTransport SshTarget",
            "sync.transports.ssh_relay": "SshConnector SshRelay",
            "sync.transports.swarm": "SwarmOptions SwarmTransport",
        },
    )

__all__ = [
    "BUILTIN_SCHEMAS",
    "CHECKPOINTS",
    "DEFAULT_PIECE_SIZE",
    "FILE_CATEGORIES",
    "GAMES_SCHEMA",
    "ROLLOUTS_SCHEMA",
    "AllSourcesFailedError",
    "BacklogFullError",
    "ClusterSyncStats",
    "ContentMismatchError",
    "Cursor",
    "FallbackSources",
    "FieldKind",
    "FieldSpec",
    "FileCatalog",
    "FileChangedError",
    "FileHandlers",
    "FileSyncError",
    "FileTransferError",
    "FileTransferTimeoutError",
    "GamesPull",
    "HttpTransport",
    "IngestResult",
    "InsufficientSpaceError",
    "Limits",
    "Listing",
    "ManifestCache",
    "ManifestEntry",
    "ManifestError",
    "ManifestPage",
    "MountInfo",
    "NodeSyncStats",
    "P2PFallbackSync",
    "P2PSyncClient",
    "PartialFile",
    "PathRefusedError",
    "PeerRef",
    "PieceBook",
    "PieceHandlers",
    "PieceMap",
    "PullItem",
    "PullResult",
    "RateLimiter",
    "RecordClient",
    "RecordHandlers",
    "RecordPage",
    "RecordPullError",
    "RecordQueryError",
    "RecordRejectedError",
    "RecordRequestError",
    "RecordRequestTimeoutError",
    "RecordSchema",
    "RecordSchemaError",
    "RecordStore",
    "RecordStores",
    "RecordSyncStats",
    "RecordValidationError",
    "RemoteManifest",
    "RsyncTransport",
    "SinceQuery",
    "SnapshotError",
    "SnapshotInfo",
    "SpaceReserve",
    "SshAuthError",
    "SshConnector",
    "SshHostKeyError",
    "SshRelay",
    "SshTarget",
    "StorageCapabilities",
    "StorageKind",
    "StorageProvider",
    "StoreBusyError",
    "StoreClosedError",
    "StoreFullError",
    "StoreLockedError",
    "StoreOptions",
    "StoreStatus",
    "StoreWriteError",
    "SwarmOptions",
    "SwarmTransport",
    "SyncCoordinator",
    "SyncError",
    "SyncOptions",
    "SyncStats",
    "Tombstone",
    "TombstoneStore",
    "TransferBusyError",
    "TransferResult",
    "Transport",
    "UnknownCategoryError",
    "UnknownStoreError",
    "check_raw_query_value",
    "choose_pieces",
    "cluster_stats_from_json",
    "detect_storage",
    "fetch_page",
    "file_routes",
    "free_bytes",
    "full_cluster_sync",
    "install_file",
    "is_disk_full",
    "make_directories",
    "open_inside",
    "open_partial",
    "parse_retry_after",
    "parse_since_query",
    "piece_routes",
    "plan_deletions",
    "plan_pulls",
    "provider_of",
    "pull_records",
    "record_routes",
    "retry_delay_s",
    "row_to_record",
    "schema_from_mapping",
    "sync_error",
    "translated",
    "validate_records",
    "validate_rel_path",
    "verify_present_pieces",
]
