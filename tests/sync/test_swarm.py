"""Fan-out on real sockets: a node serves the verified pieces of a file it is still
downloading (and nothing else), a puller gets pieces from peers that hold them, and a peer
that serves a corrupted piece has its breaker tripped while the piece comes from elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from health import BreakerConfig, BreakerRegistry, CircuitState
from sync import (
    FileCatalog,
    HttpTransport,
    PeerRef,
    PieceBook,
    SwarmOptions,
    SwarmTransport,
    file_routes,
    piece_routes,
)
from sync.files.manifest import ManifestEntry
from sync.files.pieces import decode_bitfield
from sync.guards import partial_name
from tests.sync.files_fixtures import CATEGORIES, FAST_TIMEOUTS, LOCAL_MOUNTS, PIECE, write_file

FAST = SwarmOptions(poll_s=0.02)


class PieceNode:
    """A catalog with file and piece routes on a real 127.0.0.1 server, and a piece book."""

    def __init__(self, base: Path, node_id: str) -> None:
        self.node_id = node_id
        self.book = PieceBook()
        roots = {category: base / category for category in CATEGORIES}
        self.catalog = FileCatalog(roots, base / "cache", piece_size=PIECE, mounts=LOCAL_MOUNTS)
        self.server: TestServer | None = None

    @property
    def peer(self) -> PeerRef:
        assert self.server is not None
        return PeerRef(self.node_id, str(self.server.make_url("")).rstrip("/"))

    def root(self) -> Path:
        return self.catalog.root("models")

    async def entry(self, rel: str) -> ManifestEntry:
        listing = await self.catalog.listing("models")
        return next(e for e in listing.entries if e.path == rel)


@contextlib.asynccontextmanager
async def piece_node(base: Path, node_id: str) -> AsyncIterator[PieceNode]:
    node = PieceNode(base, node_id)
    async with node.catalog:
        app = web.Application()
        app.router.add_routes(file_routes(node.catalog, on_served=node.book.count_served))
        app.router.add_routes(piece_routes(node.catalog, node.book))
        node.server = TestServer(app, host="127.0.0.1", port=0)
        await node.server.start_server()
        try:
            yield node
        finally:
            await node.server.close()


async def test_a_downloading_node_serves_only_its_verified_pieces(tmp_path: Path) -> None:
    data = os.urandom(3 * PIECE + 100)
    async with piece_node(tmp_path / "o", "o") as origin, piece_node(tmp_path / "p", "p") as p:
        write_file(origin.root() / "m.bin", data)
        entry = await origin.entry("m.bin")
        partial = p.root() / partial_name(entry.hash)
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data[:PIECE] + b"\0" * PIECE + data[2 * PIECE :])
        holding = p.book.hold("models", entry, partial)
        holding.have.update({0, 2})
        holding.pending.add(1)
        base = f"{p.peer.url}/v1/sync/models"
        query = {"path": "m.bin", "hash": entry.hash}
        async with ClientSession() as session:
            async with session.get(f"{base}/pieces", params=query) as answer:
                assert answer.status == 200
                held = await answer.json()
            assert decode_bitfield(held["have"], 4) == {0, 2}
            assert decode_bitfield(held["pending"], 4) == {1}
            assert (held["complete"], held["piece_count"]) == (False, 4)
            async with session.get(f"{base}/piece", params={**query, "index": "2"}) as answer:
                assert answer.status == 200
                assert await answer.read() == data[2 * PIECE : 3 * PIECE]
                assert answer.headers["X-Shoal-Piece-Hash"] == entry.piece_hashes()[2]
            for index, status in (("1", 404), ("3", 404), ("4", 416), ("x", 400)):
                params = {**query, "index": index}
                async with session.get(f"{base}/piece", params=params) as answer:
                    assert answer.status == status, index
            other = {"path": "m.bin", "hash": "0" * 64}
            async with session.get(f"{base}/pieces", params=other) as answer:
                assert answer.status == 404
            holding.have.clear()  # only fetching: announced, so others wait instead of asking
            async with session.get(f"{base}/pieces", params=query) as answer:
                assert answer.status == 200
                early = await answer.json()
            assert decode_bitfield(early["have"], 4) == set()
            assert decode_bitfield(early["pending"], 4) == {1}
            p.book.release(holding)
            async with session.get(f"{base}/pieces", params=query) as answer:
                assert answer.status == 404  # the download is over and nothing was installed
            async with session.get(
                f"{origin.peer.url}/v1/sync/models/pieces", params=query
            ) as answer:
                complete = await answer.json()
            assert complete["complete"] is True
            assert decode_bitfield(complete["have"], 4) == {0, 1, 2, 3}
        assert p.book.served_bytes == {"models": PIECE}


async def test_pieces_come_from_the_peer_that_holds_them(tmp_path: Path) -> None:
    data = os.urandom(8 * PIECE)
    async with (
        piece_node(tmp_path / "o", "o") as origin,
        piece_node(tmp_path / "h", "h") as holder,
        piece_node(tmp_path / "p", "p") as puller,
        HttpTransport(node_id="p", timeouts=FAST_TIMEOUTS) as http,
    ):
        write_file(origin.root() / "m.bin", data)
        write_file(holder.root() / "m.bin", data)
        entry = await origin.entry("m.bin")
        swarm = SwarmTransport(http, puller.book, lambda: [holder.peer], node_id="p", options=FAST)
        result = await swarm.fetch(origin.peer, "models", entry, puller.root())
        assert (puller.root() / "m.bin").read_bytes() == data
        assert result.bytes_transferred == len(data)
        assert holder.book.served_bytes == {"models": len(data)}
        assert origin.book.served_bytes == {}
        assert puller.book.tallies()["models"]["from_peers_bytes"] == len(data)
        assert puller.book.holding("models", "m.bin", entry.hash) is None


async def test_a_peer_serving_a_corrupted_piece_is_tripped_and_the_piece_comes_elsewhere(
    tmp_path: Path,
) -> None:
    data = os.urandom(6 * PIECE)
    asked: list[str] = []

    async def pieces(request: web.Request) -> web.Response:
        held = {
            "path": "m.bin",
            "hash": request.query["hash"],
            "size": len(data),
            "piece_size": PIECE,
            "piece_count": 6,
            "complete": True,
            "have": "fc",
            "pending": "00",
            "uploads": 0,
        }
        return web.json_response(held)

    async def piece(request: web.Request) -> web.Response:
        index = int(request.query["index"])
        asked.append(request.query["index"])
        chunk = bytearray(data[index * PIECE : (index + 1) * PIECE])
        chunk[100] ^= 0xFF
        return web.Response(body=bytes(chunk))

    liar_app = web.Application()
    liar_app.router.add_get("/v1/sync/models/pieces", pieces)
    liar_app.router.add_get("/v1/sync/models/piece", piece)
    liar_server = TestServer(liar_app, host="127.0.0.1", port=0)
    await liar_server.start_server()
    breakers = BreakerRegistry(BreakerConfig(failure_threshold=5))
    try:
        liar = PeerRef("liar", str(liar_server.make_url("")).rstrip("/"))
        async with (
            piece_node(tmp_path / "o", "o") as origin,
            piece_node(tmp_path / "p", "p") as puller,
            HttpTransport(node_id="p", timeouts=FAST_TIMEOUTS) as http,
        ):
            write_file(origin.root() / "m.bin", data)
            entry = await origin.entry("m.bin")
            swarm = SwarmTransport(
                http, puller.book, lambda: [liar], node_id="p", breakers=breakers, options=FAST
            )
            async with asyncio.timeout(30):
                await swarm.fetch(origin.peer, "models", entry, puller.root())
            assert (puller.root() / "m.bin").read_bytes() == data
            assert asked, "the liar holds every piece: it is asked first (rarest first)"
            assert breakers.breaker_for("liar", "http").state is CircuitState.OPEN
            assert origin.book.served_bytes == {"models": len(data)}
    finally:
        await liar_server.close()


async def _pull_beside_an_idle_member(
    tmp_path: Path, options: SwarmOptions
) -> tuple[list[float], float, float]:
    """Pull 16 pieces from an origin at 128 KiB/s while a member that holds nothing is asked
    too: when it was asked, when the download started and how long it took."""
    data = os.urandom(16 * PIECE)
    asked: list[float] = []

    async def pieces(request: web.Request) -> web.Response:
        asked.append(asyncio.get_running_loop().time())
        return web.json_response({"error": "not_held"}, status=404)

    idle_app = web.Application()
    idle_app.router.add_get("/v1/sync/models/pieces", pieces)
    idle_server = TestServer(idle_app, host="127.0.0.1", port=0)
    await idle_server.start_server()
    try:
        idle = PeerRef("idle", str(idle_server.make_url("")).rstrip("/"))
        async with (
            piece_node(tmp_path / "o", "o") as origin,
            piece_node(tmp_path / "p", "p") as puller,
            HttpTransport(
                node_id="p", timeouts=FAST_TIMEOUTS, bandwidth_bytes_per_s=128 << 10
            ) as http,
        ):
            write_file(origin.root() / "m.bin", data)
            entry = await origin.entry("m.bin")
            swarm = SwarmTransport(http, puller.book, lambda: [idle], node_id="p", options=options)
            started = asyncio.get_running_loop().time()
            await swarm.fetch(origin.peer, "models", entry, puller.root())
            took_s = asyncio.get_running_loop().time() - started
        assert (puller.root() / "m.bin").read_bytes() == data
    finally:
        await idle_server.close()
    return asked, started, took_s


async def test_a_member_holding_nothing_is_asked_again_only_after_the_quiet_interval(
    tmp_path: Path,
) -> None:
    options = SwarmOptions(poll_s=0.02, quiet_poll_s=0.3, alone_after_s=0.0)
    asked, _, took_s = await _pull_beside_an_idle_member(tmp_path, options)
    assert took_s > 0.3  # the download cap makes it last several quiet intervals
    assert 1 <= len(asked) <= took_s / 0.3 + 1, (len(asked), took_s)


ARRIVAL_SLACK_S = 0.1
"""An ask the puller decided inside its young window reaches the idle member a little later
(the window starts after `started`, and a loaded machine delays the request): asks in this
slack after the window are neither early nor late."""


async def test_a_member_holding_nothing_is_asked_at_every_poll_at_the_start(
    tmp_path: Path,
) -> None:
    """Pullers started together find each other at once: during the first alone_after_s of a
    download, a member that holds nothing yet is not left quiet for quiet_poll_s."""
    options = SwarmOptions(poll_s=0.02, quiet_poll_s=60.0, alone_after_s=0.4)
    asked, started, _ = await _pull_beside_an_idle_member(tmp_path, options)
    early = [at for at in asked if at - started < 0.4]
    late = [at for at in asked if at - started >= 0.4 + ARRIVAL_SLACK_S]
    assert len(early) >= 3, asked  # polled again and again while the download was young
    assert len(late) <= 1, asked  # then quiet for quiet_poll_s
