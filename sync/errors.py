"""Exceptions of the sync package.

SyncError -- base of every error raised by sync; sqlite3, aiohttp and OSError errors are chained
 +-- RecordSchemaError (also ValueError) -- a record store schema is declared wrongly
 +-- RecordValidationError (also ValueError) -- one record broke its schema: index, field, message
 +-- RecordQueryError (also ValueError) -- a query parameter is bad; `param` names it
 +-- UnknownStoreError (also LookupError) -- no record store of that name
 +-- StoreClosedError -- the record store is closed or closing
 +-- StoreBusyError -- the store's queue stayed full for max_wait_s; carries retry_after_s
 +-- StoreWriteError -- SQLite failed to open, write or read a record store
 +-- SnapshotError -- a snapshot could not be written, or is corrupt or of another schema
 +-- RecordRequestError -- a request to a node's record endpoints failed; carries status
 |    +-- RecordRejectedError -- the node refused the records (400, 404, 413); never retried
 +-- RecordPullError -- a pull stopped partway; `result` says what was committed and where to resume
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sync.records.types import PullResult

__all__ = [
    "RecordPullError",
    "RecordQueryError",
    "RecordRejectedError",
    "RecordRequestError",
    "RecordSchemaError",
    "RecordValidationError",
    "SnapshotError",
    "StoreBusyError",
    "StoreClosedError",
    "StoreWriteError",
    "SyncError",
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


class StoreWriteError(SyncError):
    """SQLite failed to open, write or read a record store; nothing of the failed batch is kept."""


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
