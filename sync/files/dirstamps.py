"""Directory stamps: the (ctime_ns, inode) of every directory of a scanned tree, so a recent
listing is reused only while no directory changed. Creating, deleting or renaming a file changes
its directory's ctime (which, unlike mtime, no tool can set back), so one stat per directory
tells whether a listing still holds, without a stat per file and without inotify.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

RACY_NS = 100_000_000
"""A directory changed this close to the scan's start may change again within the same
timestamp tick of a coarse filesystem clock, unseen: such a listing is not reused."""
INLINE_STAMPS = 32
"""Directories checked on the event loop; more are checked in a thread."""


@dataclass(frozen=True, slots=True)
class DirStamps:
    """The stamps of one scan's directories; `racy` when one changed too close to the scan."""

    stamps: tuple[tuple[str, int, int], ...]
    racy: bool


class StampRecorder:
    """Collects the stamp of each directory a scan walks, taken before its entries are read
    (so a change during the scan shows as a change at the next check). Blocking."""

    def __init__(self, started_ns: int) -> None:
        self._started_ns = started_ns
        self._stamps: list[tuple[str, int, int]] = []
        self._racy = False

    def record(self, directory: str) -> None:
        try:
            info = os.stat(directory, follow_symlinks=False)
        except OSError:
            self._racy = True  # gone or unreadable: the next check must scan again
            return
        if info.st_ctime_ns >= self._started_ns - RACY_NS:
            self._racy = True
        self._stamps.append((directory, info.st_ctime_ns, info.st_ino))

    def done(self) -> DirStamps:
        return DirStamps(tuple(self._stamps), self._racy)


def still_current(stamps: DirStamps) -> bool:
    """True when no directory of the scan changed since (no file created, deleted or renamed
    in any of them) and none changed too close to the scan. Blocking: one stat per directory."""
    if stamps.racy:
        return False
    for directory, ctime_ns, ino in stamps.stamps:
        try:
            info = os.stat(directory, follow_symlinks=False)
        except OSError:
            return False
        if info.st_ctime_ns != ctime_ns or info.st_ino != ino:
            return False
    return True


async def unchanged_since(stamps: DirStamps | None) -> bool:
    """`still_current(stamps)` (False without stamps), off the event loop for a large tree."""
    if stamps is None:
        return False
    if len(stamps.stamps) <= INLINE_STAMPS:
        return still_current(stamps)
    return await asyncio.to_thread(still_current, stamps)
