"""A real SSH server for the rsync tests: asyncssh on 127.0.0.1 port 0 with a generated host
key, accepting one generated client key, running only `rsync --server ...` commands (as real
subprocesses, no shell). Faults for the contract suite: rewrite a command's paths, or close the
channel after some bytes."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shlex
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from config import Timeouts
from sync import HttpTransport, PeerRef, RsyncTransport, SshTarget, Transport
from tests.sync.files_fixtures import FAST_TIMEOUTS, FileNode

ENV_VAR = "SHOAL_TEST_RSYNC"
Rewrite = Callable[[list[str]], list[str]]


@dataclass(frozen=True)
class Fault:
    """What the server does to one command: rewrite its argv, close after some bytes."""

    rewrite: Rewrite | None = None
    die_after_bytes: int | None = None


def write_key(key: asyncssh.SSHKey, path: Path) -> Path:
    key.write_private_key(str(path))
    path.chmod(0o600)
    return path


def generate_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


def known_hosts_line(host: str, port: int, key: asyncssh.SSHKey) -> str:
    public = key.export_public_key("openssh").decode().strip()
    return f"[{host}]:{port} {public}\n"


class SshServer:
    """asyncssh server (async context manager); `known_hosts` and `client_key` are written
    into `directory` for clients."""

    def __init__(
        self,
        directory: Path,
        *,
        host_key: asyncssh.SSHKey | None = None,
        rewrite: Rewrite | None = None,
        die_after_bytes: int | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.host_key = host_key or generate_key()
        self.client_key = generate_key()
        self.client_key_path = write_key(self.client_key, directory / "client_key")
        self.known_hosts = directory / "known_hosts"
        self.rewrite = rewrite
        self.die_after_bytes = die_after_bytes
        self.commands: list[list[str]] = []
        self.next_faults: list[Fault] = []
        self.port = 0
        self._server: asyncssh.SSHAcceptor | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> SshServer:
        authorized = asyncssh.import_authorized_keys(
            self.client_key.export_public_key("openssh").decode()
        )
        self._server = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_host_keys=[self.host_key],
            authorized_client_keys=authorized,
            process_factory=self._start,
            encoding=None,
            allow_scp=False,
            sftp_factory=None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.known_hosts.write_text(known_hosts_line("127.0.0.1", self.port, self.host_key))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _start(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        task = asyncio.ensure_future(self._run(process))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        argv = shlex.split(process.command or "")
        if argv[:2] != ["rsync", "--server"]:
            process.stderr.write(b"only rsync --server commands are allowed\n")
            process.exit(126)
            return
        fault = self.next_faults.pop(0) if self.next_faults else Fault(self.rewrite)
        if fault.rewrite is not None:
            argv = fault.rewrite(argv)
        die_after = fault.die_after_bytes
        die_after = self.die_after_bytes if die_after is None else die_after
        self.commands.append(argv)
        child = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        assert child.stderr is not None
        try:
            pumps = [
                asyncio.ensure_future(_pump_in(process.stdin, child.stdin)),
                asyncio.ensure_future(_pump_out(child.stdout, process.stdout, die_after)),
                asyncio.ensure_future(_copy(child.stderr, process.stderr)),
            ]
            try:
                await asyncio.gather(*pumps[1:])
            except (_Died, BrokenPipeError, ConnectionError):
                child.kill()
                process.close()
                return
            finally:
                pumps[0].cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
            process.exit(await child.wait())
        finally:
            if child.returncode is None:
                child.kill()
            # Read the pipes to their end too, so that their transports close now (a pump
            # cancelled mid-read leaves one paused, reported unclosed when collected).
            child.stdin.close()
            await child.communicate()


class _Died(Exception):
    pass


async def _pump_out(
    source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes], die_after: int | None
) -> None:
    sent = 0
    while chunk := await source.read(65536):
        if die_after is not None and sent + len(chunk) > die_after:
            sink.write(chunk[: max(0, die_after - sent)])
            raise _Died
        sent += len(chunk)
        sink.write(chunk)
        await sink.drain()


async def _pump_in(source: asyncssh.SSHReader[bytes], sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
        sink.close()


async def _copy(source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]) -> None:
    while chunk := await source.read(65536):
        sink.write(chunk)
        await sink.drain()


class ThreadedSshServer:
    """An SshServer on its own event loop in a daemon thread, shared by tests whose loops
    differ (the contract suite's rsync case); `close()` stops both."""

    def __init__(self, directory: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.server = SshServer(directory)
        asyncio.run_coroutine_threadsafe(self.server.__aenter__(), self._loop).result(30)

    def close(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()


class RsyncCase:
    """The contract suite's rsync case: every node's data dir served by one shared SSH server;
    faults are one-shot (the next command reads a corrupted copy, or its channel dies)."""

    name = "rsync"
    puller = "rsync"
    keeps_verified_pieces = False  # the mismatching temp file is deleted, not a delta basis

    def __init__(self) -> None:
        self._ssh: ThreadedSshServer | None = None
        self.roots: dict[str, Path] = {}

    def ssh(self) -> SshServer:
        if self._ssh is None:
            self._ssh = ThreadedSshServer(Path(tempfile.mkdtemp(prefix="shoal-ssh-")))
            atexit.register(self._ssh.close)
        return self._ssh.server

    def transports(self, http: HttpTransport) -> dict[str, Transport]:
        ssh = self.ssh()
        target = SshTarget("127.0.0.1", ssh.port, key_path=str(ssh.client_key_path))
        transport = RsyncTransport(
            lambda peer: target,
            known_hosts=ssh.known_hosts,
            timeouts=FAST_TIMEOUTS,
            remote_root=lambda peer, category: str(self.roots[peer.node_id] / category),
        )
        return {"rsync": transport}

    def peer(self, node: FileNode) -> PeerRef:
        self.roots[node.node_id] = node.base / "data"
        ssh = self.ssh()
        os.environ[ENV_VAR] = json.dumps(
            {
                "port": ssh.port,
                "key": str(ssh.client_key_path),
                "known_hosts": str(ssh.known_hosts),
                "roots": {node_id: str(root) for node_id, root in self.roots.items()},
            }
        )
        return PeerRef(node.node_id, node.peer.url, (self.name,))

    @contextlib.asynccontextmanager
    async def faulty_peer(
        self, node: FileNode, corrupt_after: int | None = None, die_after: int | None = None
    ) -> AsyncIterator[PeerRef]:
        peer = self.peer(node)
        ssh = self.ssh()
        if corrupt_after is None:
            ssh.next_faults.append(Fault(die_after_bytes=die_after))
            yield peer
            return
        with tempfile.TemporaryDirectory(prefix="shoal-corrupt-") as copy:
            original = str(node.base / "data")
            shutil.copytree(original, copy, dirs_exist_ok=True)
            for directory, _, names in os.walk(copy):
                for name in names:
                    _flip_byte(Path(directory) / name, corrupt_after)

            def rewrite(argv: list[str]) -> list[str]:
                return [arg.replace(original, copy, 1) for arg in argv]

            ssh.next_faults.append(Fault(rewrite, die_after))
            yield peer


def rsync_from_env(timeouts: Timeouts, bandwidth_bytes_per_s: float | None) -> RsyncTransport:
    """The rsync transport of a puller subprocess, configured by the RsyncCase that started
    it (through the SHOAL_TEST_RSYNC environment variable). Its remote shells run on a pooled
    connection through the relay, as in the daemon, so the SIGKILL rounds cover the relay (the
    pool ends with the process)."""
    from node.ssh import SSHPool, pooled_connector

    config = json.loads(os.environ[ENV_VAR])
    target = SshTarget("127.0.0.1", config["port"], key_path=config["key"])
    roots: dict[str, str] = config["roots"]
    pool = SSHPool(Path(config["known_hosts"]), connect_timeout_s=timeouts.ssh_connect_s)
    return RsyncTransport(
        lambda peer: target,
        known_hosts=Path(config["known_hosts"]),
        timeouts=timeouts,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        remote_root=lambda peer, category: f"{roots[peer.node_id]}/{category}",
        connections=pooled_connector(pool),
    )


def _flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        if byte:
            handle.seek(offset)
            handle.write(bytes([byte[0] ^ 0xFF]))
