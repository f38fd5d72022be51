"""Path and space guards of file sync: relative paths stay inside their root, transfers leave
a free-space reserve, and the names of temp, partial and marker files are recognised and swept.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from sync.errors import InsufficientSpaceError, PathRefusedError

logger = logging.getLogger(__name__)

INTERNAL_PREFIX = ".shoal-"
TEMP_PREFIX = ".shoal-tmp-"
PARTIAL_PREFIX = ".shoal-partial-"
MAX_PATH_CHARS = 4096
MAX_COMPONENT_CHARS = 255
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c|00)", re.IGNORECASE)
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class SpaceReserve:
    """Free space a transfer must leave: the larger of `min_free_bytes` and `min_free_fraction`
    of the filesystem's size."""

    min_free_bytes: int = 1 << 30
    min_free_fraction: float = 0.05

    def __post_init__(self) -> None:
        if self.min_free_bytes < 0 or not 0.0 <= self.min_free_fraction < 1.0:
            raise ValueError(
                "SpaceReserve needs min_free_bytes >= 0 and 0 <= min_free_fraction < 1, got "
                f"{self.min_free_bytes} and {self.min_free_fraction}"
            )

    def reserve_bytes(self, total_bytes: int) -> int:
        """The bytes that must stay free on a filesystem of `total_bytes`."""
        return max(self.min_free_bytes, int(total_bytes * self.min_free_fraction))


def validate_rel_path(path: str) -> str:
    """`path` if it is a plain relative path (a/b/c.bin); else PathRefusedError saying why.

    Refused: empty, absolute, `.`/`..`/empty components, NUL or other control characters,
    over-long names, and our own `.shoal-` temp names.
    """
    if not isinstance(path, str) or not path:
        raise PathRefusedError(str(path), "empty path")
    if len(path) > MAX_PATH_CHARS:
        raise PathRefusedError(path[:64], f"longer than {MAX_PATH_CHARS} characters")
    if _CONTROL_CHARACTER.search(path):
        raise PathRefusedError(path, "contains NUL or a control character")
    if path.startswith("/"):
        raise PathRefusedError(path, "absolute path")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise PathRefusedError(path, f"component {part!r} is not allowed")
        if len(part) > MAX_COMPONENT_CHARS:
            raise PathRefusedError(path, f"a component is longer than {MAX_COMPONENT_CHARS}")
        if part.startswith(INTERNAL_PREFIX):
            raise PathRefusedError(path, "names starting with .shoal- are internal")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PathRefusedError(path.encode("utf-8", "replace").decode(), "not UTF-8") from exc
    return path


def check_raw_query_value(raw_value: str) -> None:
    """Refuse a still percent-encoded query value that hides a separator or NUL (%2f %5c %00)."""
    if _ENCODED_SEPARATOR.search(raw_value):
        raise PathRefusedError(raw_value, "encoded separator or NUL")


def dest_path(root: Path, rel_path: str) -> Path:
    """Where `rel_path` lands under `root` (validated; no filesystem access)."""
    return root.joinpath(*validate_rel_path(rel_path).split("/"))


def _inside(root_real: str, candidate: str) -> bool:
    return candidate == root_real or candidate.startswith(root_real.rstrip("/") + "/")


def open_inside(root: Path, rel_path: str) -> tuple[int, os.stat_result]:
    """Open `rel_path` under `root` read-only: (fd, fstat). Blocking; run it in a thread.

    Refuses (PathRefusedError) a bad path, a symlink that resolves outside the root and
    anything but a regular file; FileNotFoundError when it does not exist. The check is made
    on the opened descriptor, so a symlink swapped in between cannot escape.
    """
    validate_rel_path(rel_path)
    root_real = os.path.realpath(root)
    resolved = os.path.realpath(os.path.join(root_real, rel_path))
    if not _inside(root_real, resolved):
        raise PathRefusedError(rel_path, "resolves outside the category root")
    fd = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        opened = os.path.realpath(f"/proc/self/fd/{fd}")
        if not _inside(root_real, opened):
            raise PathRefusedError(rel_path, "resolves outside the category root")
        info = os.fstat(fd)
        if not _is_regular(info):
            raise PathRefusedError(rel_path, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _is_regular(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode)


def free_space(directory: Path) -> tuple[int, int]:
    """(free bytes available to us, total bytes) of the filesystem holding `directory`."""
    usage = shutil.disk_usage(directory)
    return usage.free, usage.total


def check_free_space(
    directory: Path,
    needed_bytes: int,
    reserve: SpaceReserve,
    usage: tuple[int, int] | None = None,
) -> None:
    """Raise InsufficientSpaceError when writing `needed_bytes` into `directory` would leave
    less free space than `reserve`. Blocking (statvfs); `usage` (free, total) skips the call."""
    free, total = usage if usage is not None else free_space(directory)
    reserve_bytes = reserve.reserve_bytes(total)
    if free - max(0, needed_bytes) < reserve_bytes:
        raise InsufficientSpaceError(str(directory), needed_bytes, free, reserve_bytes)


def is_internal_name(name: str) -> bool:
    """True for our temp, partial and marker files (never listed, served or synced)."""
    return name.startswith(INTERNAL_PREFIX)


def partial_name(content_hash: str) -> str:
    """The resumable partial file of content `content_hash` in its destination directory."""
    return f"{PARTIAL_PREFIX}{content_hash}"


def temp_name(final_name: str) -> str:
    """A unique temp name for a file about to become `final_name` in the same directory."""
    return f"{TEMP_PREFIX}{final_name[:100]}-{os.urandom(6).hex()}"


def sweep_stale_files(
    root: Path, keep_hashes: frozenset[str], partial_max_age_s: float, now: float | None = None
) -> list[Path]:
    """Delete temp files under `root`, and partial files older than `partial_max_age_s` whose
    hash is not in `keep_hashes`; returns what was removed. Blocking; run before transfers."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = [name for name in dirnames if not is_internal_name(name)]
        for name in filenames:
            path = Path(directory, name)
            if name.startswith(TEMP_PREFIX):
                stale = True
            elif name.startswith(PARTIAL_PREFIX):
                if name[len(PARTIAL_PREFIX) :] in keep_hashes:
                    continue
                try:
                    stale = now - path.lstat().st_mtime >= partial_max_age_s
                except FileNotFoundError:
                    continue
            else:
                continue
            if stale:
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                removed.append(path)
    if removed:
        logger.info("removed %d stale temp or partial files under %s", len(removed), root)
    return removed
