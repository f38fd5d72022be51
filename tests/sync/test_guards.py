"""Path and space guards: every refused path form (unit and over HTTP, with nothing read),
authentication of the file routes behind the node's middleware, the free-space reserve."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from config import load_settings, signing_middleware
from health import BreakerConfig, BreakerRegistry
from node import AuthPolicy, NodeRuntime, build_app
from node.component import Served
from node.routes import CoreRoutes
from sync import (
    FileCatalog,
    FileHandlers,
    HttpTransport,
    InsufficientSpaceError,
    PathRefusedError,
    PeerRef,
    file_routes,
)
from sync.guards import (
    SpaceReserve,
    check_free_space,
    dest_path,
    open_inside,
    sweep_stale_files,
    validate_rel_path,
)
from tests.sync.files_fixtures import (
    FAST_TIMEOUTS,
    LOCAL_MOUNTS,
    PIECE,
    CountingHasher,
    FileNode,
)

SECRET = b"0123456789abcdef0123456789abcdef"
REFUSED = [
    "",
    "/etc/passwd",
    "../secret.txt",
    "a/../../secret.txt",
    "a/./b",
    "a//b",
    "a/",
    "..",
    "a\x00b",
    "a\nb",
    ".shoal-partial-" + "0" * 64,
    "x/.shoal-tmp-y-1",
    "a" * 300,
]


@pytest.mark.parametrize("path", REFUSED)
def test_validate_rel_path_refuses(path: str) -> None:
    with pytest.raises(PathRefusedError):
        validate_rel_path(path)


@pytest.mark.parametrize("path", ["a", "a/b/c.bin", "with space/ü.txt", "a..b", "...x"])
def test_validate_rel_path_accepts(path: str) -> None:
    assert validate_rel_path(path) == path
    assert dest_path(Path("/r"), path) == Path("/r", *path.split("/"))


def _layout(tmp_path: Path) -> Path:
    root = tmp_path / "data" / "models"
    (root / "sub").mkdir(parents=True)
    (root / "ok.bin").write_bytes(b"fine")
    (tmp_path / "secret.txt").write_bytes(b"TOP SECRET")
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "secret.txt").write_bytes(b"TOP SECRET")
    (root / "link-out").symlink_to(tmp_path / "secret.txt")
    (root / "dir-out").symlink_to(tmp_path / "outdir")
    (root / "link-in").symlink_to(root / "ok.bin")
    return root


def test_open_inside_follows_only_symlinks_that_stay_inside(tmp_path: Path) -> None:
    root = _layout(tmp_path)
    for rel in ["link-out", "dir-out/secret.txt", "sub"]:
        with pytest.raises(PathRefusedError):
            open_inside(root, rel)
    fd, info = open_inside(root, "link-in")
    os.close(fd)
    assert info.st_size == 4
    with pytest.raises(FileNotFoundError):
        open_inside(root, "missing")


RAW_REFUSED = [
    "path=%2Fetc%2Fpasswd",
    "path=/etc/passwd",
    "path=../secret.txt",
    "path=sub/../../secret.txt",
    "path=..%2fsecret.txt",
    "path=..%2Fsecret.txt",
    "path=sub%2F..%2F..%2Fsecret.txt",
    "path=%2e%2e/secret.txt",
    "path=..%5csecret.txt",
    "path=ok.bin%00",
    "path=ok%00.bin",
    "path=link-out",
    "path=dir-out/secret.txt",
    "path=",
    "path=sub",
    "nopath=1",
    "path=.shoal-partial-abc",
]


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[tuple[TestServer, CountingHasher]]:
    _layout(tmp_path)
    hasher = CountingHasher()
    catalog = FileCatalog(
        {"models": tmp_path / "data" / "models"},
        tmp_path / "cache",
        piece_size=PIECE,
        mounts=LOCAL_MOUNTS,
        hasher=hasher,
    )
    async with catalog:
        app = aiohttp.web.Application()
        app.router.add_routes(file_routes(catalog))
        async with TestServer(app, host="127.0.0.1") as server:
            yield server, hasher


@pytest.mark.parametrize("query", RAW_REFUSED)
@pytest.mark.parametrize("leaf", ["file", "manifest"])
async def test_http_refuses_every_escape_and_reads_nothing(
    guarded: tuple[TestServer, CountingHasher], query: str, leaf: str
) -> None:
    server, hasher = guarded
    if leaf == "manifest" and query == "nopath=1":
        return  # a manifest without path= is the whole listing
    base = str(server.make_url("")).rstrip("/")
    url = URL(f"{base}/v1/sync/models/{leaf}?{query}", encoded=True)
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        body = await response.read()
    assert response.status == 400, (query, body)
    assert b"SECRET" not in body
    assert hasher.calls == 0


async def test_http_serves_the_plain_path(guarded: tuple[TestServer, CountingHasher]) -> None:
    server, _ = guarded
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.make_url("/v1/sync/models/file?path=ok.bin")) as response,
    ):
        assert response.status == 200
        assert await response.read() == b"fine"


async def test_pull_request_refuses_bad_bodies(guarded: tuple[TestServer, CountingHasher]) -> None:
    server, _ = guarded
    url = server.make_url("/v1/sync/models/pull")
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json={"path": "x"}) as response,
    ):
        assert response.status == 503  # no puller mounted on this server


def _runtime(tmp_path: Path) -> NodeRuntime:
    settings = load_settings(env={"SHOAL_DATA_DIR": str(tmp_path)}).settings
    return NodeRuntime(
        settings=settings,
        node_id="node-a",
        address="127.0.0.1",
        version="1.0",
        breakers=BreakerRegistry(BreakerConfig()),
    )


async def test_file_routes_behind_auth_refuse_unsigned_requests(tmp_path: Path) -> None:
    root = _layout(tmp_path)
    catalog = FileCatalog(
        {"models": root}, tmp_path / "cache", piece_size=PIECE, mounts=LOCAL_MOUNTS
    )
    async with catalog:
        app = build_app(
            _runtime(tmp_path),
            AuthPolicy(secret=SECRET),
            [CoreRoutes(), Served(FileHandlers(catalog, None))],
        )
        async with TestServer(app, host="127.0.0.1") as server:
            base = str(server.make_url("")).rstrip("/")
            async with aiohttp.ClientSession() as plain:
                for leaf in ["manifest", "file?path=ok.bin"]:
                    async with plain.get(f"{base}/v1/sync/models/{leaf}") as response:
                        assert response.status == 401
                async with plain.post(f"{base}/v1/sync/models/pull", json={}) as response:
                    assert response.status == 401
            signing = (signing_middleware(SECRET, "tester"),)
            async with (
                aiohttp.ClientSession(middlewares=signing) as signed,
                signed.get(f"{base}/v1/sync/models/file?path=ok.bin") as response,
            ):
                assert response.status == 200
                assert await response.read() == b"fine"
            peer = PeerRef("node-a", base)
            async with HttpTransport(node_id="b", secret=SECRET, timeouts=FAST_TIMEOUTS) as http:
                listing = await http.list_manifest(peer, "models", PIECE)
                entry = next(e for e in listing.entries if e.path == "ok.bin")
                await http.fetch(peer, "models", entry, tmp_path / "dest")
            assert (tmp_path / "dest" / "ok.bin").read_bytes() == b"fine"
            async with (
                aiohttp.ClientSession(middlewares=signing) as signed,
                signed.get(f"{base}/v1/openapi.json") as response,
            ):
                paths = (await response.json())["paths"]
            assert "/v1/sync/{category}/file" in paths


def test_space_reserve_refuses_before_the_transfer(tmp_path: Path) -> None:
    reserve = SpaceReserve(min_free_bytes=1 << 30, min_free_fraction=0.05)
    assert reserve.reserve_bytes(100 << 30) == 5 << 30
    assert reserve.reserve_bytes(4 << 30) == 1 << 30
    check_free_space(tmp_path, 1 << 30, reserve, usage=(10 << 30, 100 << 30))
    with pytest.raises(InsufficientSpaceError) as caught:
        check_free_space(tmp_path, 6 << 30, reserve, usage=(10 << 30, 100 << 30))
    assert caught.value.reserve_bytes == 5 << 30
    with pytest.raises(InsufficientSpaceError):
        check_free_space(tmp_path, 1, SpaceReserve(min_free_bytes=1 << 62))
    with pytest.raises(ValueError, match="SpaceReserve"):
        SpaceReserve(min_free_fraction=1.5)


def test_sweep_removes_temp_files_and_old_unreferenced_partials(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    keep = "k" * 64
    for name in [".shoal-tmp-x-1", "a/.shoal-tmp-y-2", f".shoal-partial-{keep}", "data.bin"]:
        (tmp_path / name).write_bytes(b"x")
    old = tmp_path / "a" / ".shoal-partial-old"
    young = tmp_path / "a" / ".shoal-partial-young"
    old.write_bytes(b"x")
    young.write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    removed = sweep_stale_files(tmp_path, frozenset({keep}), partial_max_age_s=3600)
    names = sorted(str(p.relative_to(tmp_path)) for p in removed)
    assert names == [".shoal-tmp-x-1", "a/.shoal-partial-old", "a/.shoal-tmp-y-2"]
    assert (tmp_path / f".shoal-partial-{keep}").exists()
    assert young.exists()


async def test_pull_never_writes_through_a_symlink_out_of_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with FileNode(tmp_path / "a", "a") as a, FileNode(tmp_path / "b", "b") as b:
        a.write("evil/x.bin", b"payload")
        (b.root() / "evil").symlink_to(outside)
        stats = await b.sync.sync("models", [a.peer])
        assert stats.files_transferred == 0
        assert "outside the category root" in stats.errors[0]
        assert list(outside.iterdir()) == []
