"""The rsync-over-SSH transport against a real asyncssh server and the real rsync binary:
a complete file, host keys unknown or changed refused, a wrong client key refused, a file
changed on the peer detected (temp removed), and the pure helpers."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from config import HostEntry, Timeouts
from sync.errors import ContentMismatchError, FileTransferError, SshAuthError, SshHostKeyError
from sync.files.manifest import ManifestEntry
from sync.transports.protocol import PeerRef
from sync.transports.rsync import RsyncTransport, classify_failure, default_remote_root, parse_stats
from sync.transports.ssh_target import SshTarget
from tests.sync.files_fixtures import hash_file, internal_files
from tests.sync.ssh_server import SshServer, generate_key, known_hosts_line, write_key

PIECE = 64 << 10
TIMEOUTS = Timeouts(ssh_connect_s=5.0, sync_s=30.0, sync_piece_s=10.0)
PEER = PeerRef("a", "http://127.0.0.1:9", ("rsync",))


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[SshServer]:
    async with SshServer(tmp_path / "ssh") as ssh:
        yield ssh


def _transport(server: SshServer, data: Path, **kw: object) -> RsyncTransport:
    options: dict[str, object] = {"known_hosts": server.known_hosts, "timeouts": TIMEOUTS}
    options.update(kw)
    key = str(options.pop("key", server.client_key_path))
    target = SshTarget("127.0.0.1", server.port, key_path=key, data_dir=str(data))
    return RsyncTransport({"a": target}, **options)  # type: ignore[arg-type]


def _write(root: Path, rel: str, data: bytes, mtime_ns: int = 1_700_000_000_123_456_789) -> Path:
    path = root / "models" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def _entry(path: Path, rel: str) -> ManifestEntry:
    size, digest, pieces = hash_file(path, PIECE)
    return ManifestEntry(
        rel, size, path.stat().st_mtime_ns, digest, pieces if len(pieces) > 1 else (), PIECE
    )


async def test_complete_file_is_installed(server: SshServer, tmp_path: Path) -> None:
    data = os.urandom(5 * PIECE + 17)
    source = _write(tmp_path / "peer", "ckpt/step 1.pt", data)
    entry = _entry(source, "ckpt/step 1.pt")
    dest = tmp_path / "local" / "models"
    async with _transport(server, tmp_path / "peer") as transport:
        result = await transport.fetch(PEER, "models", entry, dest)
    final = dest / "ckpt" / "step 1.pt"
    assert final.read_bytes() == data
    assert final.stat().st_mtime_ns == entry.mtime_ns
    assert (result.transport, result.peer, result.hash) == ("rsync", "a", entry.hash)
    assert result.bytes_transferred == len(data)
    assert internal_files(dest) == []
    assert not (dest / "ckpt" / ".shoal-rsync-partial").exists()
    assert server.commands
    assert server.commands[0][:3] == ["rsync", "--server", "--sender"]


async def test_unknown_host_key_is_refused(server: SshServer, tmp_path: Path) -> None:
    source = _write(tmp_path / "peer", "m.bin", b"x" * 1000)
    known = tmp_path / "empty_known_hosts"
    known.write_text("")
    dest = tmp_path / "local"
    async with _transport(server, tmp_path / "peer", known_hosts=known) as transport:
        with pytest.raises(SshHostKeyError) as caught:
            await transport.fetch(PEER, "models", _entry(source, "m.bin"), dest)
    assert "127.0.0.1" in str(caught.value)
    assert str(known) in str(caught.value)
    assert not (dest / "m.bin").exists()
    assert server.commands == []


async def test_missing_known_hosts_file_is_refused(server: SshServer, tmp_path: Path) -> None:
    source = _write(tmp_path / "peer", "m.bin", b"x" * 1000)
    missing = tmp_path / "nowhere" / "known_hosts"
    async with _transport(server, tmp_path / "peer", known_hosts=missing) as transport:
        with pytest.raises(SshHostKeyError, match="missing"):
            await transport.fetch(PEER, "models", _entry(source, "m.bin"), tmp_path / "local")


async def test_changed_host_key_is_refused(server: SshServer, tmp_path: Path) -> None:
    source = _write(tmp_path / "peer", "m.bin", b"x" * 1000)
    known = tmp_path / "old_known_hosts"
    known.write_text(known_hosts_line("127.0.0.1", server.port, generate_key()))
    async with _transport(server, tmp_path / "peer", known_hosts=known) as transport:
        with pytest.raises(SshHostKeyError, match="not verifiable"):
            await transport.fetch(PEER, "models", _entry(source, "m.bin"), tmp_path / "local")
    assert server.commands == []


async def test_wrong_client_key_is_refused(server: SshServer, tmp_path: Path) -> None:
    source = _write(tmp_path / "peer", "m.bin", b"x" * 1000)
    wrong = write_key(generate_key(), tmp_path / "wrong_key")
    async with _transport(server, tmp_path / "peer", key=wrong) as transport:
        with pytest.raises(SshAuthError) as caught:
            await transport.fetch(PEER, "models", _entry(source, "m.bin"), tmp_path / "local")
    assert isinstance(caught.value, FileTransferError)
    assert server.commands == []


async def test_file_changed_on_the_peer_is_a_mismatch(server: SshServer, tmp_path: Path) -> None:
    source = _write(tmp_path / "peer", "m.bin", os.urandom(3 * PIECE))
    entry = _entry(source, "m.bin")
    _write(tmp_path / "peer", "m.bin", os.urandom(3 * PIECE))
    dest = tmp_path / "local"
    async with _transport(server, tmp_path / "peer") as transport:
        with pytest.raises(ContentMismatchError):
            await transport.fetch(PEER, "models", entry, dest)
    assert not (dest / "m.bin").exists()
    assert internal_files(dest) == []


async def test_file_changed_mid_transfer_is_a_mismatch(server: SshServer, tmp_path: Path) -> None:
    size = 64 * PIECE  # 4 MiB at 1 MiB/s: the tail is rewritten long before rsync reads it
    source = _write(tmp_path / "peer", "m.bin", os.urandom(size))
    entry = _entry(source, "m.bin")
    dest = tmp_path / "local"
    async with _transport(server, tmp_path / "peer", bandwidth_bytes_per_s=1 << 20) as transport:
        fetch = asyncio.ensure_future(transport.fetch(PEER, "models", entry, dest))
        async with asyncio.timeout(20):
            while not server.commands:
                await asyncio.sleep(0.01)
        with source.open("r+b") as handle:
            handle.seek(size - PIECE)
            handle.write(os.urandom(PIECE))
        with pytest.raises(ContentMismatchError):
            await fetch
    assert not (dest / "m.bin").exists()
    assert internal_files(dest) == []


def test_remote_root_from_inventory() -> None:
    entry = HostEntry(
        ssh_host="10.0.0.5",
        ssh_user="gpu",
        ssh_port=2222,
        ssh_key="~/.ssh/id_shoal",
        path="~/shoal",
        storage_paths={"models": "/mnt/nvme/models"},
    )
    target = SshTarget.from_host(entry)
    assert (target.host, target.port, target.user) == ("10.0.0.5", 2222, "gpu")
    assert default_remote_root(target, "models") == "/mnt/nvme/models"
    assert default_remote_root(target, "games") == "shoal/games"
    transport = RsyncTransport(lambda peer: SshTarget(data_dir="/srv/shoal"))
    assert transport.remote_path(PEER, "games", "a/b.db") == "/srv/shoal/games/a/b.db"
    assert transport.target(PEER).host == "127.0.0.1"


def test_stats_and_failures_are_parsed() -> None:
    stats = "Number of files: 1\nLiteral data: 1,234,567 bytes\nMatched data: 89 bytes\n"
    assert parse_stats(stats) == (1234567, 89)
    assert parse_stats("") == (0, 0)
    error = classify_failure("a:m", 255, "shoal-ssh: host-key: h:22: bad key\nrsync: closed")
    assert isinstance(error, SshHostKeyError)
    assert str(error) == "h:22: bad key"
    assert isinstance(classify_failure("a:m", 255, "shoal-ssh: auth: no"), SshAuthError)
    other = classify_failure("a:m", 23, "rsync: link_stat failed\nrsync error: code 23")
    assert type(other) is FileTransferError
    assert "exited 23" in str(other)
