"""Record keys, the (time, key) cursor and the result of a pull: plain data that imports nothing
of sync, so sync.errors can carry a PullResult without an import cycle."""

from __future__ import annotations

from dataclasses import dataclass

RecordKey = str | int
Cursor = tuple[float, RecordKey | None]
"""(time, key) of the last record seen; key None means every record at or after `time`."""


@dataclass(frozen=True)
class PullResult:
    """A pull: records received, newly inserted, already present, and the cursor to resume from."""

    pulled: int
    inserted: int
    duplicates: int
    cursor: Cursor | None
