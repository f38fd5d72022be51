"""Sync between nodes: record stores (games, rollouts) with durable ingestion and peer pulls."""

from __future__ import annotations

from sync.errors import (
    RecordPullError,
    RecordQueryError,
    RecordRejectedError,
    RecordRequestError,
    RecordSchemaError,
    RecordValidationError,
    SnapshotError,
    StoreBusyError,
    StoreClosedError,
    StoreWriteError,
    SyncError,
    UnknownStoreError,
)
from sync.files.catalog import FILE_CATEGORIES, FileCatalog
from sync.files.engine import SyncCoordinator, SyncOptions
from sync.files.errors import (
    AllSourcesFailedError,
    ContentMismatchError,
    FileChangedError,
    FileSyncError,
    FileTransferError,
    InsufficientSpaceError,
    ManifestError,
    PathRefusedError,
    TransferBusyError,
    UnknownCategoryError,
)
from sync.files.manifest import DEFAULT_PIECE_SIZE, ManifestEntry, ManifestPage, hash_file
from sync.files.manifest_cache import Listing, ManifestCache
from sync.files.plan import ClusterSyncStats, P2PFallbackSync, PullItem, SyncStats, plan_pulls
from sync.files.routes import file_route_docs, file_routes
from sync.guards import SpaceReserve, validate_rel_path
from sync.records.client import RecordClient, parse_retry_after, retry_delay_s
from sync.records.pull import P2PSyncClient, fetch_page, pull_records
from sync.records.registry import RecordStores
from sync.records.routes import add_record_routes, record_route_docs, record_routes
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
)
from sync.transports.http import HttpTransport, RemoteManifest
from sync.transports.partial import (
    PartialFile,
    install_file,
    make_directories,
    open_partial,
    verify_present_pieces,
)
from sync.transports.protocol import PeerRef, TransferResult, Transport
from sync.transports.rsync import HostKeyError, RsyncTransport, SshAuthError, SshTarget

__all__ = [
    "BUILTIN_SCHEMAS",
    "DEFAULT_PIECE_SIZE",
    "FILE_CATEGORIES",
    "GAMES_SCHEMA",
    "ROLLOUTS_SCHEMA",
    "AllSourcesFailedError",
    "ClusterSyncStats",
    "ContentMismatchError",
    "Cursor",
    "FieldKind",
    "FieldSpec",
    "FileCatalog",
    "FileChangedError",
    "FileSyncError",
    "FileTransferError",
    "HostKeyError",
    "HttpTransport",
    "IngestResult",
    "InsufficientSpaceError",
    "Listing",
    "ManifestCache",
    "ManifestEntry",
    "ManifestError",
    "ManifestPage",
    "MountInfo",
    "P2PFallbackSync",
    "P2PSyncClient",
    "PartialFile",
    "PathRefusedError",
    "PeerRef",
    "PullItem",
    "PullResult",
    "RecordClient",
    "RecordPage",
    "RecordPullError",
    "RecordQueryError",
    "RecordRejectedError",
    "RecordRequestError",
    "RecordSchema",
    "RecordSchemaError",
    "RecordStore",
    "RecordStores",
    "RecordValidationError",
    "RemoteManifest",
    "RsyncTransport",
    "SinceQuery",
    "SnapshotError",
    "SnapshotInfo",
    "SpaceReserve",
    "SshAuthError",
    "SshTarget",
    "StorageCapabilities",
    "StorageKind",
    "StorageProvider",
    "StoreBusyError",
    "StoreClosedError",
    "StoreOptions",
    "StoreStatus",
    "StoreWriteError",
    "SyncCoordinator",
    "SyncError",
    "SyncOptions",
    "SyncStats",
    "TransferBusyError",
    "TransferResult",
    "Transport",
    "UnknownCategoryError",
    "UnknownStoreError",
    "add_record_routes",
    "detect_storage",
    "fetch_page",
    "file_route_docs",
    "file_routes",
    "hash_file",
    "install_file",
    "make_directories",
    "open_partial",
    "parse_retry_after",
    "parse_since_query",
    "plan_pulls",
    "pull_records",
    "record_route_docs",
    "record_routes",
    "retry_delay_s",
    "row_to_record",
    "schema_from_mapping",
    "validate_records",
    "validate_rel_path",
    "verify_present_pieces",
]
