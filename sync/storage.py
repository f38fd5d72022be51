"""Storage providers: what kind of filesystem holds each category (local disk, shared NFS,
ephemeral tmpfs/overlay), read from /proc/mounts, and the identity of shared storage.
"""

from __future__ import annotations

import enum
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

MOUNTS_FILE = Path("/proc/mounts")
MARKER_NAME = ".shoal-storage-id"
SHARED_TYPES = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre"})
EPHEMERAL_TYPES = frozenset({"tmpfs", "ramfs", "overlay", "overlayfs"})


class StorageKind(enum.StrEnum):
    """LOCAL: a disk of this host; NFS: shared with other hosts; EPHEMERAL: gone on restart."""

    LOCAL = "local"
    NFS = "nfs"
    EPHEMERAL = "ephemeral"


@dataclass(frozen=True)
class MountInfo:
    """One line of /proc/mounts: device or export, mount point, filesystem type."""

    source: str
    mount_point: str
    fs_type: str


@dataclass(frozen=True)
class StorageCapabilities:
    """What a storage kind promises: shared with other hosts, survives a reboot, and whether
    rename within a directory is atomic and advisory locks (flock) work reliably."""

    shared: bool
    persistent: bool
    atomic_rename: bool
    reliable_locks: bool


_CAPABILITIES: Mapping[StorageKind, StorageCapabilities] = {
    StorageKind.LOCAL: StorageCapabilities(False, True, True, True),
    StorageKind.NFS: StorageCapabilities(True, True, True, False),
    StorageKind.EPHEMERAL: StorageCapabilities(False, False, True, True),
}


@dataclass(frozen=True)
class StorageProvider:
    """The storage under a set of category directories that sit on the same mount."""

    kind: StorageKind
    mount: MountInfo
    paths: Mapping[str, Path]

    def get_paths(self) -> dict[str, Path]:
        """Category -> directory, for the categories on this storage."""
        return dict(self.paths)

    def get_capabilities(self) -> StorageCapabilities:
        return _CAPABILITIES[self.kind]


def _unescape(field: str) -> str:
    """Undo the octal escapes of /proc/mounts (\\040 for a space, \\011, \\012, \\134)."""
    out: list[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(text: str) -> list[MountInfo]:
    """The mounts of a /proc/mounts text, in order; malformed lines are skipped."""
    mounts: list[MountInfo] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mounts.append(MountInfo(_unescape(fields[0]), _unescape(fields[1]), fields[2]))
    return mounts


def classify(fs_type: str) -> StorageKind:
    """The storage kind of a filesystem type (nfs/nfs4/cifs/fuse.* shared; tmpfs/overlay
    ephemeral; anything else local)."""
    if fs_type in SHARED_TYPES or fs_type.startswith("fuse.") or fs_type == "fuse":
        return StorageKind.NFS
    if fs_type in EPHEMERAL_TYPES:
        return StorageKind.EPHEMERAL
    return StorageKind.LOCAL


def mount_for(path: Path, mounts: Sequence[MountInfo]) -> MountInfo:
    """The mount holding `path` (the longest mount point that contains it; later mounts win)."""
    real = os.path.realpath(path)
    best: MountInfo | None = None
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        inside = real == point or point == "/" or real.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    return best if best is not None else MountInfo("unknown", "/", "unknown")


def read_mounts(mounts_file: Path = MOUNTS_FILE) -> list[MountInfo]:
    """The mounts of this host; an empty list when /proc/mounts cannot be read."""
    try:
        return parse_mounts(mounts_file.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        logger.warning("cannot read %s (%s); treating all storage as local", mounts_file, exc)
        return []


def detect_storage(
    paths: Mapping[str, Path], mounts: Sequence[MountInfo] | None = None
) -> list[StorageProvider]:
    """One provider per mount that holds at least one of the category directories."""
    mounts = read_mounts() if mounts is None else mounts
    grouped: dict[MountInfo, dict[str, Path]] = {}
    for category, path in sorted(paths.items()):
        grouped.setdefault(mount_for(path, mounts), {})[category] = path
    return [
        StorageProvider(classify(mount.fs_type), mount, categories)
        for mount, categories in grouped.items()
    ]


def provider_of(providers: Sequence[StorageProvider], category: str) -> StorageProvider | None:
    """The provider whose paths include `category`."""
    for provider in providers:
        if category in provider.paths:
            return provider
    return None


def ensure_marker(directory: Path) -> str:
    """The storage id kept in `directory`/.shoal-storage-id, created once (atomically, so nodes
    sharing the directory agree on it). Blocking."""
    marker = directory / MARKER_NAME
    try:
        return marker.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        pass
    temp = directory / f".shoal-tmp-marker-{uuid.uuid4().hex}"
    temp.write_text(uuid.uuid4().hex + "\n", encoding="utf-8")
    try:
        os.link(temp, marker)
    except FileExistsError:
        pass
    finally:
        temp.unlink(missing_ok=True)
    return marker.read_text(encoding="utf-8").strip()


def shared_id(provider: StorageProvider | None, directory: Path) -> str | None:
    """Identity of a category directory on shared storage: `export|marker`; None when the
    storage is not shared (nodes never skip copying between local disks). Blocking."""
    if provider is None or not provider.get_capabilities().shared:
        return None
    return f"{provider.mount.source}|{ensure_marker(directory)}"


def shares_storage(local_id: str | None, remote_id: str | None) -> bool:
    """True when both nodes see the same shared directory, so nothing is copied between them."""
    return local_id is not None and local_id == remote_id
