"""A real SSH server for the rsync tests: asyncssh on 127.0.0.1 port 0 with a generated host
key, accepting one generated client key, running only `rsync --server ...` commands (as real
subprocesses, no shell). Faults for the contract suite: rewrite a command's paths, or close the
channel after some bytes."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Callable
from pathlib import Path

import asyncssh

Rewrite = Callable[[list[str]], list[str]]


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
        if self.rewrite is not None:
            argv = self.rewrite(argv)
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
                asyncio.ensure_future(self._pump_out(child.stdout, process.stdout)),
                asyncio.ensure_future(_copy(child.stderr, process.stderr)),
            ]
            try:
                await asyncio.gather(*pumps[1:])
            except _Died:
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
                await child.wait()

    async def _pump_out(
        self, source: asyncio.StreamReader, sink: asyncssh.SSHWriter[bytes]
    ) -> None:
        sent = 0
        while chunk := await source.read(65536):
            if self.die_after_bytes is not None and sent + len(chunk) > self.die_after_bytes:
                sink.write(chunk[: max(0, self.die_after_bytes - sent)])
                raise _Died
            sent += len(chunk)
            sink.write(chunk)
            await sink.drain()


class _Died(Exception):
    pass


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
