"""The swarm transport: a file several nodes pull at once comes piece by piece from whichever
members hold each piece, rarest first, from the least loaded of them, and from the origin only
what no peer holds; every piece is checked against the manifest, and a peer that serves a bad
piece has its breaker tripped and the piece is fetched elsewhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from config import Timeouts
from health import BreakerRegistry, CircuitOpenError, CircuitState
from net import NetError
from sync.errors import (
    FileChangedError,
    FileSyncError,
    FileTransferError,
)
from sync.files.download import RECEIVED, PieceRun, download_run
from sync.files.manifest import ManifestEntry
from sync.files.pieces import (
    Holding,
    Limits,
    PieceBook,
    PieceMap,
    choose_pieces,
    spread_start,
    stripe_of,
)
from sync.guards import dest_path
from sync.translate import sync_error
from sync.transports.http import HttpTransport, category_path, category_url
from sync.transports.partial import (
    install_file,
    make_directories,
    open_partial,
    run_blocking,
    settle_all,
    verify_present_pieces,
)
from sync.transports.protocol import PeerRef, TransferResult

logger = logging.getLogger(__name__)

MembersFn = Callable[[], Sequence[PeerRef] | Awaitable[Sequence[PeerRef]]]
"""The alive members of this node's view (the only peers it asks for pieces)."""


@dataclass(frozen=True)
class SwarmOptions:
    """`poll_s`: how often piece maps are asked again while pieces are missing; `patience_s`:
    how long a puller with nothing in flight waits for a piece a peer is fetching before it
    asks the origin for it too; `alone_after_s`: how long no peer may hold or fetch the file
    before a puller takes `limits.origin` requests at the origin instead of one (pullers that
    start together then ask the origin for different pieces); `quiet_poll_s`: how often a
    member that holds nothing of the file (or failed) is asked again, once the download is
    `alone_after_s` old (before, one holding nothing is asked at every poll, so pullers that
    start together find each other at once); `min_pieces`: smaller files go the plain HTTP
    way."""

    limits: Limits = field(default_factory=Limits)
    poll_s: float = 0.2
    patience_s: float = 30.0
    alone_after_s: float = 2.0
    quiet_poll_s: float = 1.0
    min_pieces: int = 2


class _BadPiece(FileSyncError):
    """A piece whose bytes did not hash to the manifest's piece hash."""


class SwarmTransport:
    """Fetches multi-piece files from the origin and the members holding pieces of them (a
    Transport named "http": it replaces the plain HTTP transport in a node that fans out).
    Single-piece files, and a node with no other members, use `http` unchanged. Registers
    each download in `book`, so the node serves the verified pieces it holds meanwhile."""

    name = "http"

    def __init__(
        self,
        http: HttpTransport,
        book: PieceBook,
        members: MembersFn,
        *,
        node_id: str,
        breakers: BreakerRegistry | None = None,
        timeouts: Timeouts | None = None,
        options: SwarmOptions | None = None,
    ) -> None:
        self._http = http
        self._book = book
        self._members = members
        self._node_id = node_id
        self._breakers = breakers if breakers is not None else BreakerRegistry()
        self._timeouts = timeouts if timeouts is not None else Timeouts()
        self.options = options if options is not None else SwarmOptions()

    async def close(self) -> None:
        """Nothing of its own to close: the HTTP transport is closed by its owner."""

    async def _peers(self, origin: PeerRef) -> list[PeerRef]:
        found = self._members()
        members = await found if inspect.isawaitable(found) else found
        seen = {self._node_id, origin.node_id}
        peers: list[PeerRef] = []
        for member in members:
            if member.node_id not in seen and "http" in member.transports:
                seen.add(member.node_id)
                peers.append(member)
        return peers

    async def fetch(
        self, peer: PeerRef, category: str, entry: ManifestEntry, dest_root: Path
    ) -> TransferResult:
        """Install `entry` (see Transport); `peer` is the origin, asked only for pieces no
        member holds."""
        peers = await self._peers(peer) if entry.piece_count >= self.options.min_pieces else []
        if not peers:
            return await self._http.fetch(peer, category, entry, dest_root)
        try:
            return await self._swarm(peer, peers, category, entry, dest_root)
        except OSError as exc:
            raise FileSyncError(f"{category}/{entry.path}: local file error: {exc}") from exc

    async def _swarm(
        self,
        origin: PeerRef,
        peers: list[PeerRef],
        category: str,
        entry: ManifestEntry,
        dest_root: Path,
    ) -> TransferResult:
        started = time.monotonic()
        final = dest_path(dest_root, entry.path)
        await asyncio.to_thread(make_directories, dest_root, final.parent)
        partial = await open_partial(final.parent, entry.hash)
        holding: Holding | None = None
        try:
            verified = await run_blocking(verify_present_pieces, partial.fd, entry)
            resumed = sum(entry.piece_span(i)[1] for i, ok in enumerate(verified) if ok)
            holding = self._book.hold(category, entry, partial.path)
            holding.have.update(i for i, ok in enumerate(verified) if ok)
            run = _Run(self, origin, peers, category, entry, partial.fd, holding)
            received = await run.go()
            await run_blocking(install_file, partial.path, final, entry, partial.fd, True)
        finally:
            if holding is not None:
                self._book.release(holding)
            partial.close()
        return TransferResult.installed(
            origin,
            self.name,
            category,
            entry,
            transferred=received,
            resumed=resumed,
            started=started,
        )


class _Run:
    """One swarm download: piece maps, requests in flight, and what is still missing."""

    def __init__(
        self,
        swarm: SwarmTransport,
        origin: PeerRef,
        peers: list[PeerRef],
        category: str,
        entry: ManifestEntry,
        fd: int,
        holding: Holding,
    ) -> None:
        self.swarm = swarm
        self.origin = origin
        self.peers = {peer.node_id: peer for peer in peers}
        self.category = category
        self.entry = entry
        self.fd = fd
        self.holding = holding
        self.maps: dict[str, PieceMap] = {}
        self.loads: dict[str, int] = {}
        self.tasks: dict[asyncio.Task[int], tuple[int, str]] = {}
        self.received = 0
        self.alone = False  # no other peer pulls this file: the origin gets limits.origin
        self.others_seen_at = time.monotonic()
        self.quiet_until: dict[str, float] = {}
        self.start = spread_start(swarm._node_id, [origin.node_id, *self.peers], entry.piece_count)
        self.stripe = stripe_of(swarm._node_id, self.peers)
        self.began = time.monotonic()

    @property
    def missing(self) -> set[int]:
        return set(range(self.entry.piece_count)) - self.holding.have

    async def go(self) -> int:
        options = self.swarm.options
        idle_since: float | None = None
        polled = -float("inf")
        try:
            while self.missing:
                full = len(self.tasks) >= options.limits.total  # nothing could start anyway
                if not full and time.monotonic() - polled >= options.poll_s:
                    await self._poll()
                    polled = time.monotonic()
                waited = idle_since is not None and (
                    time.monotonic() - idle_since >= options.patience_s
                )
                self._start_requests(use_pending=waited)
                if not self.tasks:
                    idle_since = idle_since if idle_since is not None else time.monotonic()
                    await asyncio.sleep(options.poll_s)
                    continue
                idle_since = None
                done, _ = await asyncio.wait(
                    list(self.tasks), timeout=options.poll_s, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    self._settle(task)
        finally:
            for task in self.tasks:
                task.cancel()
            await settle_all(list(self.tasks))
            self.holding.pending.clear()
        return self.received

    def _start_requests(self, *, use_pending: bool) -> None:
        wanted = self.missing - self.holding.pending
        maps = {node: held for node, held in self.maps.items() if self._usable(node)}
        limits = self.swarm.options.limits
        if not self.alone:
            limits = dataclasses.replace(limits, origin=1)
        picks = choose_pieces(
            wanted,
            maps,
            self.loads,
            origin=self.origin.node_id,
            count=self.entry.piece_count,
            start=self.start,
            limits=limits,
            use_pending=use_pending,
            stripe=self.stripe,
        )
        for index, node in picks:
            peer = self.origin if node == self.origin.node_id else self.peers[node]
            task = asyncio.ensure_future(self._fetch_piece(peer, index))
            self.tasks[task] = (index, node)
            self.loads[node] = self.loads.get(node, 0) + 1
            self.holding.pending.add(index)

    def _usable(self, node: str) -> bool:
        """Not the origin (asked only as a fallback) and its breaker lets calls through."""
        if node == self.origin.node_id or node not in self.peers:
            return False
        return self.swarm._breakers.breaker_for(node, "http").state is CircuitState.CLOSED

    def _settle(self, task: asyncio.Task[int]) -> None:
        index, node = self.tasks.pop(task)
        self.loads[node] -= 1
        self.holding.pending.discard(index)
        exc = task.exception()
        from_origin = node == self.origin.node_id
        if exc is None and task.result() < 0:
            self.maps.pop(node, None)  # it no longer holds the piece: ask the others
            return
        if exc is None:
            size = task.result()
            logger.debug(
                "%s: piece %d of %s from %s", self.swarm._node_id, index, self.entry.path, node
            )
            self.holding.have.add(index)
            self.received += size
            self.swarm._book.count_received(self.category, size, from_origin=from_origin)
            return
        if from_origin:
            raise exc
        if not isinstance(exc, _BadPiece | FileTransferError):
            raise exc  # this node's own failure (its disk): no other peer would help
        self.maps.pop(node, None)
        if isinstance(exc, _BadPiece):
            self.swarm._breakers.breaker_for(node, "http").trip(str(exc))
            logger.warning("%s; its breaker is open, the piece comes from elsewhere", exc)
        else:
            logger.debug("piece %d of %s from %s: %s", index, self.entry.path, node, exc)

    async def _poll(self) -> None:
        """Ask every usable peer which pieces it holds now (a failure drops its map); a peer
        that holds and fetches none is asked again only after `quiet_poll_s`."""
        now = time.monotonic()
        nodes = [
            node
            for node in self.peers
            if self._usable(node) and self.quiet_until.get(node, 0.0) <= now
        ]
        answers = await asyncio.gather(
            *(self._piece_map(self.peers[node]) for node in nodes), return_exceptions=True
        )
        options = self.swarm.options
        early = now - self.began < options.alone_after_s
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, PieceMap):
                self.maps[node] = answer
            elif isinstance(answer, asyncio.CancelledError):
                raise answer
            else:
                self.maps.pop(node, None)
                quiet_s = options.poll_s if early and answer is None else options.quiet_poll_s
                self.quiet_until[node] = now + quiet_s
        now = time.monotonic()
        if any(held.have or held.pending for held in self.maps.values()):
            self.others_seen_at = now
        self.alone = now - self.others_seen_at >= options.alone_after_s

    async def _piece_map(self, peer: PeerRef) -> PieceMap | None:
        entry = self.entry
        url = category_url(peer, self.category, "pieces")
        params = {"path": entry.path, "hash": entry.hash}
        try:
            response = await self.swarm._http.peers().request(
                "GET", peer.url, category_path(self.category, "pieces"), params=params,
                timeout_s=self.swarm._timeouts.http_request_s, check=False,
            )  # fmt: skip
            if response.status == 404:
                return None
            if response.status != 200:
                raise FileTransferError(f"{url}: HTTP {response.status}", response.status)
            return PieceMap.from_json(response.json(), entry)
        except (NetError, ValueError) as exc:
            raise sync_error(exc, url, FileTransferError) from exc

    async def _fetch_piece(self, peer: PeerRef, index: int) -> int:
        """Fetch, check and write piece `index` from `peer`; returns its size, -1 when the
        peer no longer holds it. The origin's piece is a range of its file route (its breaker
        is the caller's); a peer's comes from its piece route, through the peer's breaker."""
        http = self.swarm._http
        if peer.node_id == self.origin.node_id:
            return await download_run(
                http.peers(),
                peer.url,
                category_path(self.category, "file"),
                self.entry,
                PieceRun(index, index),
                self.fd,
                peer.node_id,
                self.swarm._timeouts.sync_piece_s,
                http.download_limiter,
            )
        try:
            async with self.swarm._breakers.breaker_for(peer.node_id, "http"):
                try:
                    return await self._get_piece(peer, index)
                except FileChangedError:
                    return -1  # it no longer holds the piece: no fault of it
        except CircuitOpenError as exc:
            raise FileTransferError(f"{peer.node_id}: {exc}") from exc

    async def _get_piece(self, peer: PeerRef, index: int) -> int:
        entry = self.entry
        offset, length = entry.piece_span(index)
        expected = entry.piece_hashes()[index]
        params = {"path": entry.path, "hash": entry.hash, "index": str(index)}
        where = f"{peer.node_id}: {entry.path} piece {index}"
        try:
            answer = await self.swarm._http.peers().request(
                "GET", peer.url, category_path(self.category, "piece"), params=params,
                headers={"Accept-Encoding": "identity"},
                timeout_s=self.swarm._timeouts.sync_piece_s, check=False,
            )  # fmt: skip
        except NetError as exc:
            raise sync_error(exc, where, FileTransferError) from exc
        if answer.status == 404:
            raise FileChangedError(f"{where}: not held there", 404)
        if answer.status != 200:
            raise FileTransferError(f"{where}: HTTP {answer.status}", answer.status)
        data = answer.body
        if len(data) != length:
            raise _BadPiece(f"{where}: {len(data)} bytes, expected {length}")
        limiter = self.swarm._http.download_limiter
        if limiter is not None:
            await limiter.take(length)
        await run_blocking(_check_and_store, self.fd, data, offset, expected, where)
        report = RECEIVED.get()
        if report is not None:
            report(length)
        return length


def _check_and_store(fd: int, data: bytes, offset: int, expected: str, where: str) -> None:
    """Write the piece at `offset` once it hashes to `expected` (else _BadPiece). Blocking."""
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise _BadPiece(f"{where} hashed to {got[:16]}, expected {expected[:16]}")
    view = memoryview(data)
    try:
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    except OSError as exc:
        raise FileSyncError(f"{where}: cannot write the partial file: {exc}") from exc


__all__ = ["MembersFn", "SwarmOptions", "SwarmTransport"]
