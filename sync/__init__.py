"""Sync between nodes: record stores (games, rollouts) with durable ingestion and peer pulls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from net.errors import parse_retry_after
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
    from sync.records.client import RecordClient, retry_delay_s
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
    from sync.transports.rsync import RsyncTransport
    from sync.transports.ssh_relay import SshConnector, SshRelay
    from sync.transports.ssh_target import SshTarget
    from sync.transports.swarm import SwarmOptions, SwarmTransport
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
