"""The rsync transport on the node's SSH pool: transfers from one host share one pooled
connection (through the relay, the real rsync binary and a real asyncssh server), idle expiry
still applies, host-key and client-key failures keep their kinds, and a channel that dies
mid-transfer fails that transfer only."""

from __future__ import annotations

import os
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from config import Timeouts
from node.ssh import SSHPool, pooled_connector, target_endpoint
from sync import (
    FileTransferError,
    PeerRef,
    RsyncTransport,
    SshAuthError,
    SshHostKeyError,
    SshTarget,
)
from sync.files.manifest import ManifestEntry
from sync.transports import ssh as ssh_helper
from sync.transports.ssh_relay import parse_header
from tests.sync.files_fixtures import hash_file
from tests.sync.ssh_server import Fault, SshServer, generate_key, known_hosts_line, write_key

PIECE = 64 << 10
TIMEOUTS = Timeouts(ssh_connect_s=5.0, sync_s=30.0, sync_piece_s=10.0)
PEER = PeerRef("a", "http://127.0.0.1:9", ("rsync",))


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[SshServer]:
    async with SshServer(tmp_path / "ssh") as ssh:
        yield ssh


def _write(root: Path, rel: str, data: bytes) -> ManifestEntry:
    path = root / "models" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    size, digest, pieces = hash_file(path, PIECE)
    return ManifestEntry(
        rel, size, path.stat().st_mtime_ns, digest, pieces if len(pieces) > 1 else (), PIECE
    )


def _transport(
    server: SshServer, pool: SSHPool, data: Path, key: Path | None = None
) -> RsyncTransport:
    target = SshTarget(
        "127.0.0.1", server.port, key_path=str(key or server.client_key_path), data_dir=str(data)
    )
    return RsyncTransport({"a": target}, timeouts=TIMEOUTS, connections=pooled_connector(pool))


async def test_transfers_from_one_host_share_one_pooled_connection(
    server: SshServer, tmp_path: Path
) -> None:
    files = {f"shard-{i}.bin": os.urandom(PIECE * i + 31) for i in range(1, 4)}
    entries = [_write(tmp_path / "peer", name, data) for name, data in files.items()]
    dest = tmp_path / "local" / "models"
    async with SSHPool(server.known_hosts) as pool:
        async with _transport(server, pool, tmp_path / "peer") as transport:
            for entry in entries:
                result = await transport.fetch(PEER, "models", entry, dest)
                assert result.hash == entry.hash
            assert transport.relay is not None
            assert transport.relay.relayed == 3
            socket_dir = transport.relay.socket_path.parent
        assert pool.connects == 1
    for name, data in files.items():
        assert (dest / name).read_bytes() == data
    assert len(server.commands) == 3
    assert not socket_dir.exists()


async def test_idle_expiry_applies_to_rsync_connections(server: SshServer, tmp_path: Path) -> None:
    entries = [_write(tmp_path / "peer", f"f{i}", os.urandom(2000)) for i in range(2)]
    async with SSHPool(server.known_hosts, idle_s=0.0) as pool:
        async with _transport(server, pool, tmp_path / "peer") as transport:
            for entry in entries:
                await transport.fetch(PEER, "models", entry, tmp_path / "local")
        assert pool.connects == 2


async def test_unknown_host_key_fails_with_how_to_trust(server: SshServer, tmp_path: Path) -> None:
    entry = _write(tmp_path / "peer", "m.bin", b"x" * 1000)
    known = tmp_path / "other_known_hosts"
    known.write_text(known_hosts_line("127.0.0.1", server.port, generate_key()))
    async with SSHPool(known) as pool, _transport(server, pool, tmp_path / "peer") as rsync:
        with pytest.raises(SshHostKeyError, match=r"shoal ssh trust 127\.0\.0\.1:"):
            await rsync.fetch(PEER, "models", entry, tmp_path / "local")
    assert server.commands == []
    assert not (tmp_path / "local" / "m.bin").exists()


async def test_refused_client_key_is_an_auth_error(server: SshServer, tmp_path: Path) -> None:
    entry = _write(tmp_path / "peer", "m.bin", b"x" * 1000)
    wrong = write_key(generate_key(), tmp_path / "wrong_key")
    pool = SSHPool(server.known_hosts)
    async with pool, _transport(server, pool, tmp_path / "peer", key=wrong) as rsync:
        with pytest.raises(SshAuthError, match="refused"):
            await rsync.fetch(PEER, "models", entry, tmp_path / "local")


async def test_a_channel_dying_mid_transfer_fails_only_that_transfer(
    server: SshServer, tmp_path: Path
) -> None:
    big = _write(tmp_path / "peer", "big.bin", os.urandom(8 * PIECE))
    small = _write(tmp_path / "peer", "small.bin", os.urandom(3000))
    dest = tmp_path / "local"
    server.next_faults.append(Fault(die_after_bytes=2 * PIECE))
    pool = SSHPool(server.known_hosts)
    async with pool, _transport(server, pool, tmp_path / "peer") as rsync:
        with pytest.raises(FileTransferError):
            await rsync.fetch(PEER, "models", big, dest)
        await rsync.fetch(PEER, "models", small, dest)
        await rsync.fetch(PEER, "models", big, dest)
    assert (dest / "big.bin").stat().st_size == big.size
    assert (dest / "small.bin").stat().st_size == small.size


async def test_a_jump_host_travels_from_the_target_to_the_pool_endpoint(tmp_path: Path) -> None:
    """rsync's remote shell gets `--jump`, its relay request carries it, and the pool's
    endpoint jumps through that inventory host."""
    target = SshTarget("10.0.0.7", 2222, user="ops", key_path="/k", jump="bastion")
    async_pool = SSHPool(tmp_path / "known_hosts")
    transport = RsyncTransport({"a": target}, connections=pooled_connector(async_pool))
    assert transport.relay is not None
    async with transport:
        await transport.relay.start()
        argv = transport.command(PEER, "/data/models/m.bin", tmp_path / "m.bin")
    rsh = shlex.split(argv[argv.index("--rsh") + 1])
    assert rsh[rsh.index("--jump") + 1] == "bastion"
    args = ssh_helper._parser().parse_args([*rsh[3:], "10.0.0.7", "rsync", "--server"])
    relayed, command = parse_header(ssh_helper.request_line(args))
    assert command == "rsync --server"
    assert (relayed.host, relayed.port, relayed.user, relayed.jump) == (
        "10.0.0.7",
        2222,
        "ops",
        "bastion",
    )
    endpoint = target_endpoint(relayed)
    assert (endpoint.address, endpoint.port, endpoint.jump) == ("10.0.0.7", 2222, "bastion")
