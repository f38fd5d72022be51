"""The CA dir's own files: `index.json` (every certificate issued, its revocation, the CRL
number), writes that a crash cannot tear (temp file, fsync, rename, fsync of the dir), and the
lock that keeps two `shoal ca` commands from interleaving."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from config.durable import fsync_directory
from config.errors import CaError
from config.tls.identity import CertRole, serial_text

__all__ = [
    "INDEX_FILE",
    "LOCK_FILE",
    "CaIndex",
    "IssuedCertificate",
    "locked",
    "make_dir",
    "read_index",
    "write_atomic",
    "write_index",
]

INDEX_FILE = "index.json"
LOCK_FILE = ".lock"


@dataclasses.dataclass(frozen=True)
class IssuedCertificate:
    """One row of the CA's index: a certificate it issued and whether it was revoked."""

    serial: int
    name: str
    role: CertRole
    not_before: datetime
    not_after: datetime
    revoked_at: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return now > self.not_after

    def to_json(self) -> dict[str, Any]:
        return {
            "serial": serial_text(self.serial),
            "name": self.name,
            "role": self.role.value,
            "not_before": self.not_before.isoformat(),
            "not_after": self.not_after.isoformat(),
            "revoked_at": None if self.revoked_at is None else self.revoked_at.isoformat(),
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> IssuedCertificate:
        revoked = row.get("revoked_at")
        return cls(
            serial=int(row["serial"], 16),
            name=str(row["name"]),
            role=CertRole(row["role"]),
            not_before=datetime.fromisoformat(row["not_before"]),
            not_after=datetime.fromisoformat(row["not_after"]),
            revoked_at=None if revoked is None else datetime.fromisoformat(revoked),
        )


@dataclasses.dataclass(frozen=True)
class CaIndex:
    """`index.json`: the number of the newest CRL and every certificate issued, oldest first."""

    crl_number: int = 0
    issued: tuple[IssuedCertificate, ...] = ()


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` with `mode` through a temp file, fsync, rename, fsync of the dir:
    a crash leaves the old file or the new one, never a half-written key."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
        fsync_directory(path.parent)
    except OSError as exc:
        raise CaError(f"{path}: cannot write it: {exc.strerror or exc}") from exc


def make_dir(directory: Path, what: str) -> None:
    if directory.exists() and not directory.is_dir():
        raise CaError(f"{directory}: not a directory; give {what} a directory path")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CaError(f"{directory}: cannot create {what}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold the CA dir's lock file, so two `shoal ca` commands never interleave index writes."""
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise CaError(f"{directory}: cannot lock the CA dir: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_index(directory: Path) -> CaIndex:
    """The CA's `index.json`; CaError naming the file when it is unreadable or damaged."""
    path = directory / INDEX_FILE
    if not path.exists():
        return CaIndex()
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return CaIndex(
            crl_number=int(document["crl_number"]),
            issued=tuple(IssuedCertificate.from_json(row) for row in document["issued"]),
        )
    except OSError as exc:
        raise CaError(f"{path}: cannot read the index: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CaError(f"{path}: damaged index ({exc!r}); restore it from backup") from exc


def write_index(directory: Path, index: CaIndex) -> None:
    document = {
        "version": 1,
        "crl_number": index.crl_number,
        "issued": [row.to_json() for row in index.issued],
    }
    text = json.dumps(document, indent=2) + "\n"
    write_atomic(directory / INDEX_FILE, text.encode("utf-8"))
