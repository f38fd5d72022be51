"""The backup archive: an uncompressed ustar file whose last member, MANIFEST.json, names every
other member with its size and sha256. Every byte of the file is covered (headers by the tar
checksum, contents by sha256, padding and the end by being zeros), so one flipped byte anywhere
is found by `verify_archive` before anything is written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TypedDict

from node.errors import ArchiveError

FORMAT = "shoal-backup"
FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
NODE_ID_MEMBER = "node_id"
BLOCK_BYTES = tarfile.BLOCKSIZE
CHUNK_BYTES = 1 << 20
MAX_SMALL_MEMBER_BYTES = 4096
"""Members this small (the node id) are kept in memory while verifying, to check them."""

Progress = Callable[[str, int], None]
"""Called with (member name, bytes so far) while a member is written or verified."""


@dataclass(frozen=True)
class Member:
    """One member of an archive as its manifest lists it."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What an archive holds: whose node it is and every member with its hash."""

    node_id: str
    cluster: str
    created_at: float
    version: str
    members: tuple[Member, ...]

    def body_sha256(self) -> str:
        """sha256 of the manifest's content without its own digest (what `sha256` holds)."""
        return hashlib.sha256(self._document()).hexdigest()

    def to_json(self) -> bytes:
        """The manifest as stored: canonical JSON carrying its own body digest."""
        document = json.loads(self._document())
        document["sha256"] = self.body_sha256()
        return json.dumps(document, indent=1, sort_keys=True).encode()

    def _document(self) -> bytes:
        document = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "node_id": self.node_id,
            "cluster": self.cluster,
            "created_at": self.created_at,
            "version": self.version,
            "members": [vars(member) for member in self.members],
        }
        return json.dumps(document, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """The manifest in `data`; ArchiveError(MANIFEST.json) for anything else."""
        try:
            document = json.loads(data)
            if document.get("format") != FORMAT:
                raise ValueError(f"format is {document.get('format')!r}, not {FORMAT!r}")
            if document.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format_version {document.get('format_version')!r} unknown")
            members = tuple(
                Member(str(m["name"]), int(m["size"]), str(m["sha256"]))
                for m in document["members"]
            )
            manifest = cls(
                str(document["node_id"]),
                str(document["cluster"]),
                float(document["created_at"]),
                str(document["version"]),
                members,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ArchiveError(MANIFEST_NAME, f"not a shoal backup manifest: {exc}") from None
        if manifest.to_json() != data:
            raise ArchiveError(MANIFEST_NAME, "damaged: its content does not match its sha256")
        return manifest


def check_member_name(name: str) -> None:
    """Refuse a name that is absolute, climbs out with `..`, or is empty."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or name.startswith("./"):
        raise ArchiveError(name or "(empty name)", "unsafe member name: outside the data dir")


class _HashingReader:
    """Reads exactly `size` bytes of `source`, hashing them, for tarfile.addfile."""

    def __init__(self, source: IO[bytes], size: int, name: str, progress: Progress) -> None:
        self.source = source
        self.left = size
        self.name = name
        self.done = 0
        self.progress = progress
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.source.read(size)
        self.left -= len(data)
        self.done += len(data)
        self.digest.update(data)
        self.progress(self.name, self.done)
        return data


def _no_progress(name: str, done: int) -> None:
    del name, done


class ArchiveWriter:
    """Writes members one by one (hashing as it copies), then the manifest; owns the tar."""

    def __init__(self, out: IO[bytes], progress: Progress | None = None) -> None:
        self._tar = tarfile.open(  # noqa: SIM115 - closed by finish()
            fileobj=out, mode="w:", format=tarfile.USTAR_FORMAT
        )
        self._members: list[Member] = []
        self._names: set[str] = set()
        self._progress = progress or _no_progress

    def add_bytes(self, name: str, data: bytes) -> None:
        self._add(name, io.BytesIO(data), len(data))

    def add_file(self, name: str, path: Path) -> None:
        """Add the first st_size bytes of `path` as opened now (a file appended meanwhile
        contributes what it held when opened; one replaced by rename is read as opened)."""
        with path.open("rb") as source:
            self._add(name, source, os.fstat(source.fileno()).st_size)

    def _add(self, name: str, source: IO[bytes], size: int) -> None:
        check_member_name(name)
        if name in self._names or name == MANIFEST_NAME:
            raise ArchiveError(name, "member added twice")
        info = tarfile.TarInfo(name)
        info.size = size
        info.mode = 0o600
        try:
            info.tobuf(tarfile.USTAR_FORMAT)
        except ValueError as exc:
            raise ArchiveError(name, f"cannot be stored in a ustar archive: {exc}") from None
        reader = _HashingReader(source, size, name, self._progress)
        self._tar.addfile(info, reader)
        self._names.add(name)
        self._members.append(Member(name, size, reader.digest.hexdigest()))

    def finish(self, node_id: str, cluster: str, created_at: float, version: str) -> Manifest:
        """Write MANIFEST.json last and close the tar (not the file it writes to)."""
        manifest = Manifest(node_id, cluster, created_at, version, tuple(self._members))
        data = manifest.to_json()
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(data)
        info.mode = 0o600
        self._tar.addfile(info, io.BytesIO(data))
        self._tar.close()
        return manifest


@dataclass(frozen=True)
class VerifiedArchive:
    """An archive whose every byte checked out: its manifest and its small members."""

    path: Path
    manifest: Manifest
    small: dict[str, bytes]


def _read_exact_zero(f: IO[bytes], start: int, length: int) -> bool:
    f.seek(start)
    left = length
    while left > 0:
        chunk = f.read(min(CHUNK_BYTES, left))
        if not chunk:
            return False
        if chunk.count(0) != len(chunk):
            return False
        left -= len(chunk)
    return True


def _hash_member(
    tar: tarfile.TarFile, info: tarfile.TarInfo, progress: Progress
) -> tuple[str, bytes]:
    """sha256 of the member's content, and the content itself when small or the manifest."""
    digest = hashlib.sha256()
    extracted = tar.extractfile(info)
    assert extracted is not None
    keep = info.name == MANIFEST_NAME or info.size <= MAX_SMALL_MEMBER_BYTES
    done = 0
    kept = bytearray()
    while chunk := extracted.read(CHUNK_BYTES):
        digest.update(chunk)
        done += len(chunk)
        if keep:
            kept += chunk
        progress(info.name, done)
    return digest.hexdigest(), bytes(kept)


def _scan(f: IO[bytes], progress: Progress) -> tuple[list[tuple[Member, bytes]], int]:
    """Every member with its hash and small content, and where the members end. Refuses a gap,
    a non-zero padding byte, a non-file member or an unsafe name."""
    found: list[tuple[Member, bytes]] = []
    position = 0
    try:
        tar = tarfile.open(fileobj=f, mode="r:")  # noqa: SIM115 - closed by the with below
    except tarfile.TarError as exc:
        raise ArchiveError(
            MANIFEST_NAME, f"not a tar archive ({exc}): not a shoal backup"
        ) from None
    with tar:
        while True:
            try:
                info = tar.next()
            except tarfile.TarError as exc:
                after = found[-1][0].name if found else "(start)"
                raise ArchiveError(after, f"the header after it is damaged: {exc}") from None
            if info is None:
                break
            check_member_name(info.name)
            if info.offset != position or not info.isreg():
                raise ArchiveError(info.name, "not a plain member where one was expected")
            f.seek(info.offset)
            if f.read(BLOCK_BYTES) != info.tobuf(tarfile.USTAR_FORMAT):
                raise ArchiveError(info.name, "damaged: its tar header is not as written")
            digest, small = _hash_member(tar, info, progress)
            end = info.offset_data + info.size
            padded = -(-end // BLOCK_BYTES) * BLOCK_BYTES
            if not _read_exact_zero(f, end, padded - end):
                raise ArchiveError(info.name, "damaged: non-zero bytes in its padding")
            found.append((Member(info.name, info.size, digest), small))
            position = padded
    return found, position


def verify_archive(path: Path, progress: Progress | None = None) -> VerifiedArchive:
    """Check every byte of the archive at `path` against its manifest; write nothing.

    Raises ArchiveError naming the member at fault: a damaged byte (hash, header or padding),
    a member missing from or unknown to the manifest, or a file that is no shoal backup."""
    with path.open("rb") as f:
        found, end = _scan(f, progress or _no_progress)
        size = f.seek(0, os.SEEK_END)
        if not _read_exact_zero(f, end, size - end):
            after = found[-1][0].name if found else "(start)"
            raise ArchiveError(after, "damaged: the bytes after this member are not a tar end")
    if not found or found[-1][0].name != MANIFEST_NAME:
        raise ArchiveError(MANIFEST_NAME, "missing: not a shoal backup archive")
    manifest = Manifest.from_json(found[-1][1])
    listed = {member.name: member for member in manifest.members}
    seen = {member.name for member, _ in found[:-1]}
    for member, _ in found[:-1]:
        expected = listed.get(member.name)
        if expected is None:
            raise ArchiveError(member.name, "not in the manifest: a foreign member")
        if expected != member:
            raise ArchiveError(
                member.name,
                f"damaged: sha256 {member.sha256[:16]}... ({member.size} bytes) is not the "
                f"manifest's {expected.sha256[:16]}... ({expected.size} bytes)",
            )
    for name in sorted(set(listed) - seen):
        raise ArchiveError(name, "listed in the manifest but missing from the archive")
    small = {member.name: data for member, data in found[:-1] if member.size == len(data)}
    node_id = small.get(NODE_ID_MEMBER, b"").decode(errors="replace").strip()
    if node_id != manifest.node_id:
        raise ArchiveError(
            NODE_ID_MEMBER,
            f"holds node id {node_id!r} but the manifest is node {manifest.node_id!r}: "
            "a foreign member",
        )
    return VerifiedArchive(path, manifest, small)


class ManifestSummary(TypedDict):
    """A manifest as the commands print it with --json: whose, when, how many members."""

    node_id: str
    cluster: str
    created_at: float
    version: str
    members: int
    bytes: int


def manifest_summary(manifest: Manifest) -> ManifestSummary:
    """The manifest as the commands print it with --json."""
    return ManifestSummary(
        node_id=manifest.node_id,
        cluster=manifest.cluster,
        created_at=manifest.created_at,
        version=manifest.version,
        members=len(manifest.members),
        bytes=sum(member.size for member in manifest.members),
    )
