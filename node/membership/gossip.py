"""The piggyback queue: encoded updates waiting to be gossiped, one per member, least-sent first."""

from __future__ import annotations

import heapq
from collections.abc import Container
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    blob: bytes
    order: int
    transmits: int = 0


class GossipQueue:
    """Updates to piggyback on outgoing messages (a class because it owns mutable buffers).

    A newer update about a member replaces the queued one. `take` hands out the least-sent
    updates first (newest first among equals) that fit a byte budget, counts each hand-out, and
    forgets an update once it has been sent `limit` times.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[int, int, str, int]] = []
        self._order = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def push(self, key: str, blob: bytes) -> None:
        """Queue `blob` as the update about member `key`, replacing any older one."""
        self._order += 1
        self._entries[key] = _Entry(blob, self._order)
        heapq.heappush(self._heap, (0, -self._order, key, self._order))
        if len(self._heap) > 4 * len(self._entries) + 64:
            self._compact()

    def discard(self, key: str) -> None:
        self._entries.pop(key, None)

    def take(
        self, budget_bytes: int, max_count: int, limit: int, exclude: Container[str] = ()
    ) -> list[bytes]:
        """Up to `max_count` blobs whose sizes (plus one separator each) fit `budget_bytes`."""
        taken: list[bytes] = []
        back: list[tuple[int, int, str, int]] = []
        used = 0
        misses = 0
        while self._heap and len(taken) < max_count and misses < 4:
            item = heapq.heappop(self._heap)
            transmits, _, key, order = item
            entry = self._entries.get(key)
            if entry is None or entry.order != order or entry.transmits != transmits:
                continue
            if transmits >= limit:
                del self._entries[key]
                continue
            size = len(entry.blob) + 1
            if key in exclude or used + size > budget_bytes:
                misses += 1
                back.append(item)
                continue
            taken.append(entry.blob)
            used += size
            entry.transmits += 1
            back.append((entry.transmits, item[1], key, order))
        for item in back:
            heapq.heappush(self._heap, item)
        return taken

    def _compact(self) -> None:
        self._heap = [
            (entry.transmits, -entry.order, key, entry.order)
            for key, entry in self._entries.items()
        ]
        heapq.heapify(self._heap)
