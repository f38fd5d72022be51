"""Plain data of the write-ahead log: entry states and types, entries, configuration, results.

Everything here is a frozen dataclass, an enum or a Protocol; nothing owns a resource.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, Self, runtime_checkable

import orjson

from config import Timeouts
from wal.errors import WalError

SYNC_STARTED: Final = "sync_started"
"""One file transfer in flight (written by sync.files.engine; resumed by sync.files.recovery)."""
SYNC_COMPLETED: Final = "sync_completed"
"""One sync run that moved files or records, committed at once (written by node.sync_service)."""
BUILTIN_ENTRY_TYPES: Final = frozenset({SYNC_STARTED, SYNC_COMPLETED})
"""The entry types shoal itself writes; callers may append types of their own."""

MAX_ENTRY_TYPE_CHARS: Final = 128
MAX_KEY_CHARS: Final = 1024


class EntryState(enum.StrEnum):
    """Life of an entry: pending, then exactly one of committed, rolled_back or failed."""

    PENDING = "pending"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        """True for the three final states."""
        return self is not EntryState.PENDING


@dataclass(frozen=True, slots=True)
class WalEntry:
    """One logged operation as stored; times are Unix epoch seconds."""

    id: int
    entry_type: str
    key: str | None
    payload: dict[str, Any]
    state: EntryState
    created_at: float
    updated_at: float
    retries: int
    error: str | None


@dataclass(frozen=True, slots=True)
class WalConfig:
    """Tuning of one WriteAheadLog; the defaults suit a node daemon.

    max_batch / max_batch_delay_ms: a batch closes at max_batch requests, or when no more
    requests arrive, but the writer never lingers longer than max_batch_delay_ms gathering one.
    busy_timeout_s: SQLite lock wait of every connection. op_timeout_s: the longest one batch or
    read may take before the caller gets a WalError; open_timeout_s: the same for opening, which
    includes the quick check of the whole file. checkpoint_interval_s: PASSIVE checkpoint
    period while busy; idle_checkpoint_s: quiet time after which the -wal file is truncated.
    """

    max_batch: int = 1024
    max_batch_delay_ms: float = 2.0
    max_pending: int = 100_000
    max_payload_bytes: int = 1 << 20
    max_retries: int = 5
    busy_timeout_s: float = 5.0
    op_timeout_s: float = 30.0
    open_timeout_s: float = 120.0
    checkpoint_interval_s: float = 30.0
    idle_checkpoint_s: float = 1.0
    queue_limit: int = 16_384
    wal_autocheckpoint_pages: int = 1000
    journal_size_limit_bytes: int = 64 << 20
    quick_check_on_open: bool = True

    @classmethod
    def from_timeouts(cls, timeouts: Timeouts, **overrides: Any) -> Self:
        """The config whose waits come from the node's timeout table: `sqlite_busy_s`,
        `wal_op_s`, `wal_open_s`."""
        waits = {
            "busy_timeout_s": timeouts.sqlite_busy_s,
            "op_timeout_s": timeouts.wal_op_s,
            "open_timeout_s": timeouts.wal_open_s,
        }
        return cls(**{**waits, **overrides})

    def __post_init__(self) -> None:
        positive = {
            "max_batch": self.max_batch,
            "max_pending": self.max_pending,
            "max_payload_bytes": self.max_payload_bytes,
            "max_retries": self.max_retries,
            "busy_timeout_s": self.busy_timeout_s,
            "op_timeout_s": self.op_timeout_s,
            "open_timeout_s": self.open_timeout_s,
            "checkpoint_interval_s": self.checkpoint_interval_s,
            "idle_checkpoint_s": self.idle_checkpoint_s,
            "queue_limit": self.queue_limit,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"WalConfig.{name} must be positive, got {value!r}")
        non_negative = {
            "max_batch_delay_ms": self.max_batch_delay_ms,
            "wal_autocheckpoint_pages": self.wal_autocheckpoint_pages,
            "journal_size_limit_bytes": self.journal_size_limit_bytes,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"WalConfig.{name} must not be negative, got {value!r}")


@dataclass(frozen=True, slots=True)
class WalStats:
    """A snapshot of the log. Current counts and lifetime totals (kept in the file) of entries.

    queue_depth is requests waiting for the writer in this process; sizes are of the database
    file and of its SQLite -wal file (0 when absent).
    """

    pending: int
    committed: int
    rolled_back: int
    failed: int
    oldest_pending_age_s: float | None
    appended_total: int
    committed_total: int
    rolled_back_total: int
    failed_total: int
    retries_total: int
    removed_total: int
    last_id: int
    queue_depth: int
    db_size_bytes: int
    wal_file_bytes: int


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """What one `recover` pass did: handlers that succeeded (committed), raised (a retry was
    counted; `exhausted` of those reached max_retries and are now failed), and entries of a type
    without a handler, left pending."""

    recovered: int
    failed: int
    skipped: int
    exhausted: int


RecoveryHandler = Callable[[WalEntry], Awaitable[object]]


@runtime_checkable
class WalObserver(Protocol):
    """Receives measurements from a WriteAheadLog; called on the event loop, must not block."""

    def on_append(self, latency_s: float) -> None:
        """Time from an append call to its durable acknowledgement."""

    def on_pending(self, count: int) -> None:
        """Number of pending entries, after each batch the writer committed."""


def check_name(what: str, value: str, max_chars: int) -> None:
    """Raise WalError unless `value` is a non-empty str of at most `max_chars` characters."""
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise WalError(f"{what} must be a non-empty string of at most {max_chars} characters")


def as_payload(payload: object) -> dict[str, Any]:
    """A dict copy of a mapping payload; WalError for anything else."""
    if not isinstance(payload, Mapping):
        raise WalError(f"payload must be a mapping, not {type(payload).__name__}")
    return dict(payload)


def encode_json(value: object, what: str) -> str:
    """Compact, strict JSON of `value` (no NaN or infinities; enums written as their values,
    UUIDs as text); WalError naming `what` when it is not JSON."""
    try:
        text = _dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson's error: a key that is not a str, an int over 64 bits, a subclass
        return _encode_strict(value, what)
    if b"null" in text:  # orjson writes NaN and the infinities as null: the strict encoder refuses
        return _encode_strict(value, what)
    return text.decode()


def _encode_strict(value: object, what: str) -> str:
    try:
        return _encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise WalError(f"{what} is not JSON-serialisable: {exc}") from exc


def _beyond_json(value: object) -> object:
    """What orjson writes natively beyond JSON's own types, so both encoders accept the same."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_encoder() -> Callable[[object], str]:
    """json's C encoder built once: json.dumps builds one per call, half its cost. Falls back to
    a JSONEncoder with the same output where the C module is missing."""
    fallback = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_beyond_json).encode
    try:
        import _json

        encoder = _json.make_encoder(
            None, _beyond_json, _json.encode_basestring_ascii, None, ":", ",", False, False, False
        )
    except (ImportError, TypeError):
        return fallback

    def encode(value: object) -> str:
        return "".join(encoder(value, 0))

    return encode


_dumps = orjson.dumps
# orjson's C encoder is four times cheaper than json's on an append's payload; dataclasses,
# datetimes and subclasses of str, int, dict and list are left to the strict encoder, as before.
_ORJSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
_encode = _json_encoder()
