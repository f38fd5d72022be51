"""Files of the checkpoints on disk, shared by the training process and (by contract, tested)
the daemon: where they live, how a step's directory is named, which steps DCP finished, and
the content hash the daemon's sync engine checks (stdlib only: `import shoal` stays light).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_DIR",
    "ENV_DIR",
    "METADATA",
    "METADATA_COPY",
    "PIECE_BYTES",
    "FileDigest",
    "checkpoint_root",
    "file_digest",
    "finished_steps",
    "link_metadata",
    "parse_step_directory",
    "report_entry",
    "step_directory",
]

ENV_DIR = "SHOAL_CHECKPOINT_DIR"
"""The node's checkpoint directory, given to training processes by the daemon's launcher."""
DEFAULT_DIR = "checkpoints"
"""Where checkpoints go without SHOAL_CHECKPOINT_DIR (plain torchrun): ./checkpoints."""
METADATA = ".metadata"
"""DCP's metadata file, written by the coordinator rank once every rank's write finished."""
METADATA_COPY = "metadata"
"""A hard link of METADATA under a name the daemon's file routes serve (they refuse names that
begin with a dot); a node that fetched a step links METADATA back from it."""
PIECE_BYTES = 16 << 20
"""The piece size of the content hash: the daemon's sync pieces (sync.files.manifest)."""
READ_BYTES = 1 << 20
_STEP = re.compile(r"step-(\d{8,})-g(\d+)\Z")


def step_directory(step: int, generation: int) -> str:
    """`step-00000040-g2`: the directory of step `step` saved by generation `generation`."""
    return f"step-{step:08d}-g{generation}"


def parse_step_directory(name: str) -> tuple[int, int] | None:
    """(step, generation) of a step directory's name, None for any other name."""
    match = _STEP.match(name)
    return None if match is None else (int(match[1]), int(match[2]))


def checkpoint_root(env: Mapping[str, str]) -> Path:
    """The checkpoint directory: SHOAL_CHECKPOINT_DIR, else ./checkpoints."""
    return Path(env.get(ENV_DIR) or DEFAULT_DIR).expanduser()


def finished_steps(root: Path) -> list[tuple[int, int]]:
    """(step, generation) of every step directory under `root` that DCP finished (its
    METADATA written, which happens only after every rank's write), oldest first."""
    found = []
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            parsed = parse_step_directory(entry.name)
            if parsed is not None and (Path(entry.path) / METADATA).is_file():
                found.append(parsed)
    return sorted(found)


@dataclass(frozen=True, slots=True)
class FileDigest:
    """A file as the daemon's manifest lists it: size, mtime_ns, the content hash and, for a
    file of more than one piece, each piece's hash."""

    size: int
    mtime_ns: int
    hash: str
    pieces: tuple[str, ...]


def file_digest(path: Path, piece_bytes: int = PIECE_BYTES) -> FileDigest:
    """The content hash sync's manifests use: sha256 of the file for one piece, else sha256 of
    the concatenated raw piece digests (each piece `piece_bytes`)."""
    info = path.stat()
    digests: list[bytes] = []
    with path.open("rb") as handle:
        piece, in_piece = hashlib.sha256(), 0
        while chunk := handle.read(min(READ_BYTES, piece_bytes - in_piece)):
            piece.update(chunk)
            in_piece += len(chunk)
            if in_piece == piece_bytes:
                digests.append(piece.digest())
                piece, in_piece = hashlib.sha256(), 0
        if in_piece or not digests:
            digests.append(piece.digest())
    if len(digests) == 1:
        return FileDigest(info.st_size, info.st_mtime_ns, digests[0].hex(), ())
    whole = hashlib.sha256(b"".join(digests)).hexdigest()
    return FileDigest(info.st_size, info.st_mtime_ns, whole, tuple(d.hex() for d in digests))


def report_entry(directory: Path, name: str, piece_bytes: int = PIECE_BYTES) -> dict[str, Any]:
    """One file of a written report (`POST /v1/checkpoints/written`): name, size, mtime_ns,
    hash and piece hashes, as the daemon checks it against the file."""
    digest = file_digest(directory / name, piece_bytes)
    return {
        "name": name,
        "size": digest.size,
        "mtime_ns": digest.mtime_ns,
        "hash": digest.hash,
        "pieces": list(digest.pieces),
    }


def link_metadata(directory: Path, *, source: str, target: str) -> None:
    """Make `directory/target` the same file as `directory/source` (a hard link, a copy where
    links are refused), replacing an older `target` atomically."""
    temporary = directory / f".{target}.shoal-link"
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    try:
        os.link(directory / source, temporary)
    except OSError:
        shutil.copyfile(directory / source, temporary)
    os.replace(temporary, directory / target)
