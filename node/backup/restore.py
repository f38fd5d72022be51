"""Restore a verified backup archive into a data dir: every member to its place, durably, and
nothing at all when any check fails."""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from config import fsync_directory
from node.backup.archive import (
    CHUNK_BYTES,
    MANIFEST_NAME,
    NODE_ID_MEMBER,
    Manifest,
    Progress,
    VerifiedArchive,
    verify_archive,
)
from node.errors import ArchiveError, BackupError

RESTORED_MANIFEST = "backup/MANIFEST.json"
"""Where a restore keeps the archive's manifest, for the record."""


@dataclass(frozen=True)
class RestoreResult:
    """What a restore wrote."""

    data_dir: Path
    manifest: Manifest
    written: tuple[str, ...]


def target_of(data_dir: Path, name: str) -> Path:
    """Where member `name` goes: its name is its path in the restored data dir."""
    return data_dir / (RESTORED_MANIFEST if name == MANIFEST_NAME else name)


def check_target(verified: VerifiedArchive, data_dir: Path) -> None:
    """Refuse a data dir of another node, or one that holds a file the archive would replace."""
    wanted = verified.manifest.node_id
    try:
        present = (data_dir / NODE_ID_MEMBER).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        present = ""
    except OSError as exc:
        raise BackupError(f"{data_dir}: cannot read its node id: {exc}") from exc
    if present and present != wanted:
        raise ArchiveError(
            NODE_ID_MEMBER,
            f"the archive is node {wanted!r} but {data_dir} belongs to node {present!r}: "
            "a foreign archive; restore into an empty data dir",
        )
    names = [member.name for member in verified.manifest.members] + [MANIFEST_NAME]
    for name in names:
        target = target_of(data_dir, name)
        if target.exists() and not (name == NODE_ID_MEMBER and present == wanted):
            raise ArchiveError(
                name, f"{target} exists; restore into an empty data dir (nothing was written)"
            )


def restore_archive(path: Path, data_dir: Path, progress: Progress | None = None) -> RestoreResult:
    """Verify every byte of the archive, check the data dir, then write each member (temp
    name, fsync, rename, fsync of its directory). Raises ArchiveError before writing anything
    when the archive is damaged or foreign; BackupError when the data dir cannot be written."""
    verified = verify_archive(path, progress)
    check_target(verified, data_dir)
    expected = {member.name: member for member in verified.manifest.members}
    written: list[str] = []
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, mode="r:") as tar:
            for info in tar:
                member = expected.get(info.name)
                wanted = None if member is None else member.sha256
                _write_member(tar, info, target_of(data_dir, info.name), progress, wanted)
                written.append(info.name)
        fsync_directory(data_dir)
    except (OSError, tarfile.TarError) as exc:
        raise BackupError(f"restoring into {data_dir} failed after {written[-1:]}: {exc}") from exc
    return RestoreResult(data_dir, verified.manifest, tuple(written))


def _write_member(
    tar: tarfile.TarFile,
    info: tarfile.TarInfo,
    target: Path,
    progress: Progress | None,
    sha256: str | None,
) -> None:
    """Copy one member to `target` durably, once its bytes as read now have the `sha256` the
    verified manifest gives (ArchiveError, nothing put in place, when the archive changed on
    disk since it was verified)."""
    source = tar.extractfile(info)
    assert source is not None
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.restoring")
    digest = hashlib.sha256()
    done = 0
    with temp.open("wb") as out:
        while chunk := source.read(CHUNK_BYTES):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(info.name, done)
        out.flush()
        os.fsync(out.fileno())
    if sha256 is not None and digest.hexdigest() != sha256:
        temp.unlink()
        raise ArchiveError(info.name, "changed on disk while it was restored")
    os.replace(temp, target)
    fsync_directory(target.parent)
