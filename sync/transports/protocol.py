"""The Transport protocol every file transport implements (HTTP, rsync over SSH), the peer it
fetches from and the result of one fetch. The steps they share live in partial.py."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from sync.files.manifest import ManifestEntry


@dataclass(frozen=True)
class PeerRef:
    """A peer to sync with: its node id (breakers are keyed by it), the base URL of its HTTP
    API, and the transports to try with it, in order."""

    node_id: str
    url: str
    transports: tuple[str, ...] = ("http",)

    @property
    def host(self) -> str:
        """Host name or address of `url` (what an SSH transport connects to)."""
        return urlsplit(self.url).hostname or ""

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "url": self.url, "transports": list(self.transports)}

    @classmethod
    def from_json(cls, data: Any) -> PeerRef:
        """A PeerRef from its JSON form; ValueError when malformed or not an http(s) URL."""
        if not isinstance(data, dict):
            raise ValueError("peer must be an object with node_id and url")
        node_id, url = data.get("node_id"), data.get("url")
        transports = data.get("transports", ["http"])
        if not isinstance(node_id, str) or not node_id or not isinstance(url, str):
            raise ValueError("peer needs a node_id and a url")
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ValueError(f"peer url must be http(s)://HOST:PORT, got {url!r}")
        if not isinstance(transports, list) or not all(isinstance(t, str) for t in transports):
            raise ValueError("peer transports must be a list of names")
        return cls(node_id, url.rstrip("/"), tuple(transports) or ("http",))


@dataclass(frozen=True)
class TransferResult:
    """One file installed at its final path: how many bytes crossed the network this time and
    how many were reused from a partial file."""

    peer: str
    transport: str
    category: str
    path: str
    hash: str
    size_bytes: int
    bytes_transferred: int
    resumed_bytes: int
    duration_s: float

    @classmethod
    def installed(
        cls,
        peer: PeerRef,
        transport: str,
        category: str,
        entry: ManifestEntry,
        *,
        transferred: int,
        resumed: int,
        started: float,
    ) -> TransferResult:
        """The result of installing `entry` from `peer`, timed from `started` (time.monotonic)."""
        return cls(
            peer=peer.node_id,
            transport=transport,
            category=category,
            path=entry.path,
            hash=entry.hash,
            size_bytes=entry.size,
            bytes_transferred=transferred,
            resumed_bytes=resumed,
            duration_s=time.monotonic() - started,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "transport": self.transport,
            "category": self.category,
            "path": self.path,
            "hash": self.hash,
            "size_bytes": self.size_bytes,
            "bytes_transferred": self.bytes_transferred,
            "resumed_bytes": self.resumed_bytes,
            "duration_s": self.duration_s,
        }


@runtime_checkable
class Transport(Protocol):
    """Moves one file version from a peer into `dest_root`/`entry.path`.

    Contract: on return the final path holds exactly the bytes of `entry.hash`, fsynced, with
    mtime `entry.mtime_ns`, renamed into place atomically, and its directory fsynced; before
    that the final path is never touched. Partial data lives only in `.shoal-partial-<hash>` or
    `.shoal-tmp-*` files next to it (use `PartialFile` and `install_file`). Raises
    ContentMismatchError (bytes did not verify), FileChangedError (the peer no longer has
    this version), FileTransferError (network), PathRefusedError, TransferBusyError.
    CancelledError leaves the partial file for a later resume.
    """

    @property
    def name(self) -> str:
        """The name used in peer transport lists and breaker keys: "http", "rsync"."""
        ...

    async def fetch(
        self, peer: PeerRef, category: str, entry: ManifestEntry, dest_root: Path
    ) -> TransferResult: ...

    async def close(self) -> None: ...
