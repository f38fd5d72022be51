"""Pieces for peer-to-peer fan-out: what a node holds of a file (PieceMap, as
`GET .../pieces` answers it), the book of verified pieces of files still downloading
(PieceBook, with the bytes served and received), and rarest-first piece selection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sync.errors import ManifestError
from sync.files.manifest import MAX_PIECE_SIZE, MIN_PIECE_SIZE, ManifestEntry, piece_count

MAX_PIECES = 1 << 22
"""Pieces of the largest file a piece map may describe (64 TiB at 16 MiB pieces)."""


def encode_bitfield(indices: Iterable[int], count: int) -> str:
    """Hex of a bitfield of `count` bits, piece 0 in the high bit of the first byte."""
    bits = bytearray((count + 7) // 8)
    for index in indices:
        if not 0 <= index < count:
            raise ValueError(f"piece {index} outside a file of {count} pieces")
        bits[index >> 3] |= 0x80 >> (index & 7)
    return bits.hex()


def decode_bitfield(text: str, count: int) -> frozenset[int]:
    """The piece indices set in a hex bitfield of `count` bits; ValueError when it is not
    exactly that long or sets a bit past the last piece."""
    try:
        bits = bytes.fromhex(text)
    except ValueError:
        raise ValueError("bitfield must be hex digits") from None
    if len(bits) != (count + 7) // 8:
        raise ValueError(f"bitfield of {len(bits)} bytes for {count} pieces")
    found = {
        (position << 3) + bit
        for position, byte in enumerate(bits)
        if byte
        for bit in range(8)
        if byte & (0x80 >> bit)
    }
    if found and max(found) >= count:
        raise ValueError(f"bitfield sets piece {max(found)} of a file of {count} pieces")
    return frozenset(found)


@dataclass(frozen=True)
class PieceMap:
    """The pieces of one file version a node can serve now (`have`, each verified), those it
    is fetching (`pending`), and how many uploads it is serving (a load hint)."""

    path: str
    hash: str
    size: int
    piece_size: int
    have: frozenset[int]
    pending: frozenset[int] = frozenset()
    uploads: int = 0

    @property
    def piece_count(self) -> int:
        return piece_count(self.size, self.piece_size)

    @property
    def complete(self) -> bool:
        return len(self.have) == self.piece_count

    def to_json(self) -> dict[str, Any]:
        count = self.piece_count
        return {
            "path": self.path,
            "hash": self.hash,
            "size": self.size,
            "piece_size": self.piece_size,
            "piece_count": count,
            "complete": self.complete,
            "have": encode_bitfield(self.have, count),
            "pending": encode_bitfield(self.pending, count),
            "uploads": self.uploads,
        }

    @classmethod
    def from_json(cls, data: Any, entry: ManifestEntry) -> PieceMap:
        """A peer's answer for `entry`; ManifestError when it is malformed or describes
        another file (size, piece size or hash)."""
        try:
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            size, piece_size, uploads = data["size"], data["piece_size"], data.get("uploads", 0)
            if data["hash"] != entry.hash or data["path"] != entry.path:
                raise ValueError("it describes another file")
            if size != entry.size or piece_size != entry.piece_size:
                raise ValueError(
                    f"{size} bytes in pieces of {piece_size}, expected {entry.size} bytes in "
                    f"pieces of {entry.piece_size}"
                )
            if not isinstance(uploads, int) or uploads < 0:
                raise ValueError("uploads must be a count")
            count = entry.piece_count
            have = decode_bitfield(str(data["have"]), count)
            pending = decode_bitfield(str(data.get("pending", "00" * ((count + 7) // 8))), count)
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"piece map of {entry.path}: {exc}") from exc
        return cls(entry.path, entry.hash, size, piece_size, have, pending - have, uploads)


def check_map_shape(size: int, piece_size: int) -> None:
    """ValueError when a file of `size` bytes in `piece_size` pieces cannot be described."""
    if not MIN_PIECE_SIZE <= piece_size <= MAX_PIECE_SIZE or size < 0:
        raise ValueError(f"no piece map for {size} bytes in pieces of {piece_size}")
    if piece_count(size, piece_size) > MAX_PIECES:
        raise ValueError(f"a file of {size} bytes has more than {MAX_PIECES} pieces")


@dataclass
class Holding:
    """A file version this node is downloading: its partial file and the pieces verified in
    it (servable) or being fetched. Changed on the event loop; read by the piece routes."""

    category: str
    entry: ManifestEntry
    partial_path: Path
    have: set[int] = field(default_factory=set)
    pending: set[int] = field(default_factory=set)

    def piece_map(self, uploads: int) -> PieceMap:
        entry = self.entry
        return PieceMap(
            entry.path,
            entry.hash,
            entry.size,
            entry.piece_size,
            frozenset(self.have),
            frozenset(self.pending - self.have),
            uploads,
        )


class PieceBook:
    """The node's verified pieces of files in flight (what its piece routes may serve besides
    complete files), and its fan-out tallies per category: file bytes served to peers, and
    piece bytes received from peers and from origins. One per node, shared by its routes and
    its swarm transport."""

    def __init__(self) -> None:
        self._holdings: dict[tuple[str, str, str], Holding] = {}
        self._lock = threading.Lock()
        self.served_bytes: dict[str, int] = {}
        self.from_peers_bytes: dict[str, int] = {}
        self.from_origin_bytes: dict[str, int] = {}
        self.uploads = 0

    def hold(self, category: str, entry: ManifestEntry, partial_path: Path) -> Holding:
        """Register the download of `entry` into `partial_path` (release it when done)."""
        holding = Holding(category, entry, partial_path)
        self._holdings[(category, entry.path, entry.hash)] = holding
        return holding

    def release(self, holding: Holding) -> None:
        key = (holding.category, holding.entry.path, holding.entry.hash)
        if self._holdings.get(key) is holding:
            del self._holdings[key]

    def holding(self, category: str, path: str, content_hash: str) -> Holding | None:
        return self._holdings.get((category, path, content_hash))

    def count_served(self, category: str, size_bytes: int) -> None:
        """File bytes sent to a peer (any file route); called from the event loop or threads."""
        with self._lock:
            self.served_bytes[category] = self.served_bytes.get(category, 0) + size_bytes

    def count_received(self, category: str, size_bytes: int, *, from_origin: bool) -> None:
        tally = self.from_origin_bytes if from_origin else self.from_peers_bytes
        with self._lock:
            tally[category] = tally.get(category, 0) + size_bytes

    def tallies(self) -> dict[str, dict[str, int]]:
        """Per category: served_bytes, from_peers_bytes, from_origin_bytes (JSON-ready)."""
        with self._lock:
            names = sorted({*self.served_bytes, *self.from_peers_bytes, *self.from_origin_bytes})
            return {
                name: {
                    "served_bytes": self.served_bytes.get(name, 0),
                    "from_peers_bytes": self.from_peers_bytes.get(name, 0),
                    "from_origin_bytes": self.from_origin_bytes.get(name, 0),
                }
                for name in names
            }


@dataclass(frozen=True)
class Limits:
    """Requests one puller keeps in flight: per peer, at the origin, and in all; and how many
    pieces no peer holds yet may be on their way from the origin to anyone (`origin_shared`,
    this puller's included): the origin then sends a few pieces at full speed, which peers
    can pass on early, instead of every piece at a fraction of its upload."""

    per_peer: int = 2
    origin: int = 2
    total: int = 8
    origin_shared: int = 2


def spread_start(node_id: str, members: Iterable[str], count: int) -> int:
    """Where this node starts among pieces nobody holds: nodes spread evenly over the file by
    the rank of their id among `members`, so pullers ask the origin for different pieces."""
    ranked = sorted({node_id, *members})
    return ranked.index(node_id) * count // len(ranked)


@dataclass(frozen=True)
class Stripe:
    """Which puller asks the origin for a piece: piece i falls to `ranked[i % len(ranked)]`,
    and this puller is `ranked[rank]`. Pullers of one file rank themselves among the same
    members, so none asks the origin for a piece another one is fetching from it, even
    before their piece maps reach each other."""

    rank: int
    ranked: tuple[str, ...]

    def owns(self, index: int) -> bool:
        return index % len(self.ranked) == self.rank

    def owner(self, index: int) -> str:
        return self.ranked[index % len(self.ranked)]


def stripe_of(node_id: str, pullers: Iterable[str]) -> Stripe:
    """This node's stripe among `pullers` (the members that may pull the file, the origin
    left out), by the rank of its id."""
    ranked = tuple(sorted({node_id, *pullers}))
    return Stripe(ranked.index(node_id), ranked)


def choose_pieces(
    wanted: Iterable[int],
    maps: Mapping[str, PieceMap],
    loads: Mapping[str, int],
    *,
    origin: str,
    count: int,
    start: int = 0,
    limits: Limits = Limits(),
    use_pending: bool = False,
    stripe: Stripe | None = None,
) -> list[tuple[int, str]]:
    """Which of the `wanted` pieces to request now, and from whom: rarest first (fewest peers
    holding it, then fewest fetching it, then those of this puller's `stripe`, then nearest
    after `start`), each from the least loaded peer holding it (`loads`: this puller's
    requests in flight per peer, then the peer's own uploads) within `limits`. A piece no
    peer holds comes from `origin`, unless a peer is fetching it already, or it is of the
    stripe of a puller whose map shows it pulling the file, or `limits.origin_shared` such
    pieces are on their way, and not `use_pending` (the peers will hold them soon)."""
    in_flight = dict(loads)
    budget = limits.total - sum(in_flight.values())
    if budget <= 0:
        return []

    def holders(index: int) -> list[str]:
        return [peer for peer, held in maps.items() if index in held.have and peer != origin]

    def pending(index: int) -> int:
        return sum(1 for peer, held in maps.items() if index in held.pending and peer != origin)

    held_anywhere = {i for peer, held in maps.items() if peer != origin for i in held.have}
    coming = {i for peer, held in maps.items() if peer != origin for i in held.pending}
    from_origin = len(coming - held_anywhere) + in_flight.get(origin, 0)

    def foreign(index: int) -> bool:
        return stripe is not None and not stripe.owns(index)

    def owner_pulls(index: int) -> bool:
        """Another puller whose map shows it pulling the file asks the origin for it."""
        if stripe is None or stripe.owns(index):
            return False
        held = maps.get(stripe.owner(index))
        return held is not None and bool(held.have or held.pending)

    order = sorted(
        (len(holders(i)), pending(i), foreign(i), (i - start) % max(1, count), i)
        for i in set(wanted)
    )
    picks: list[tuple[int, str]] = []
    for _, fetching, _, _, index in order:
        if len(picks) >= budget:
            break
        free = [p for p in holders(index) if in_flight.get(p, 0) < limits.per_peer]
        if free:
            peer = min(free, key=lambda p: (in_flight.get(p, 0), maps[p].uploads, p))
        elif holders(index) or ((fetching or owner_pulls(index)) and not use_pending):
            continue
        elif in_flight.get(origin, 0) < limits.origin and (
            use_pending or from_origin < limits.origin_shared
        ):
            peer = origin
            from_origin += 1
        else:
            continue
        in_flight[peer] = in_flight.get(peer, 0) + 1
        picks.append((index, peer))
    return picks
