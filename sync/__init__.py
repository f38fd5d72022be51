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
from sync.record_client import RecordClient, parse_retry_after, retry_delay_s
from sync.record_pull import P2PSyncClient, fetch_page, pull_records
from sync.record_routes import add_record_routes, record_route_docs, record_routes
from sync.record_schema import (
    BUILTIN_SCHEMAS,
    GAMES_SCHEMA,
    ROLLOUTS_SCHEMA,
    FieldKind,
    FieldSpec,
    RecordSchema,
    schema_from_mapping,
)
from sync.record_store import RecordStore
from sync.record_stores import RecordStores
from sync.record_types import (
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
from sync.record_validate import row_to_record, validate_records

__all__ = [
    "BUILTIN_SCHEMAS",
    "GAMES_SCHEMA",
    "ROLLOUTS_SCHEMA",
    "Cursor",
    "FieldKind",
    "FieldSpec",
    "IngestResult",
    "P2PSyncClient",
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
    "SinceQuery",
    "SnapshotError",
    "SnapshotInfo",
    "StoreBusyError",
    "StoreClosedError",
    "StoreOptions",
    "StoreStatus",
    "StoreWriteError",
    "SyncError",
    "UnknownStoreError",
    "add_record_routes",
    "fetch_page",
    "parse_retry_after",
    "parse_since_query",
    "pull_records",
    "record_route_docs",
    "record_routes",
    "retry_delay_s",
    "row_to_record",
    "schema_from_mapping",
    "validate_records",
]
