"""Pooled SSH connections for rsync: rsync's remote shell (`python -m sync.transports.ssh
--relay SOCKET ...`) does not connect itself but asks this relay, in the transport's process,
over a private unix socket; the relay runs the remote command on a connection from a
`SshConnector` (a pool, with idle expiry, shared with whatever else of the process uses SSH) and
streams the command's stdin, stdout, stderr and exit status back.

Wire (constants in sync.transports.ssh), helper -> relay: one JSON line
`{"host", "port", "user", "key", "jump", "command"}`, then the command's stdin bytes (the helper
half-closes the socket at its end). Relay -> helper: frames of one kind byte, a 4-byte
big-endian length and the payload: `o` stdout, `e` stderr, `x` the exit status (4-byte
signed), `f` a failure before the command ran (`KIND: message`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import asyncssh

from config.closing import AsyncClosing
from sync.errors import FileTransferError, SshAuthError, SshHostKeyError
from sync.transports.ssh import (
    EXIT,
    EXIT_STATUS,
    FAILURE,
    FRAME,
    KIND_AUTH,
    KIND_CONNECT,
    KIND_HOST_KEY,
    STDERR,
    STDOUT,
)
from sync.transports.ssh_target import SshTarget

logger = logging.getLogger(__name__)

SshConnector = Callable[[SshTarget], AbstractAsyncContextManager[asyncssh.SSHClientConnection]]
"""A connection to a target for the block (typically leased from a pool). Raises SshHostKeyError
or SshAuthError for those failures, any other exception for the rest."""

_CHUNK = 1 << 16
_MAX_HEADER = 1 << 16


def frame(kind: bytes, payload: bytes) -> bytes:
    """One relay frame."""
    return FRAME.pack(kind, len(payload)) + payload


def parse_header(line: bytes) -> tuple[SshTarget, str]:
    """(target, command) of a request line; ValueError when it is not one."""
    fields = json.loads(line)
    if not isinstance(fields, dict):
        raise ValueError("the request is not a JSON object")
    host, port, command = fields.get("host"), fields.get("port"), fields.get("command")
    user, key, jump = fields.get("user"), fields.get("key"), fields.get("jump")
    if not isinstance(host, str) or not host or not isinstance(command, str) or not command:
        raise ValueError("the request needs a host and a command")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port {port!r} is not in 1..65535")
    if not all(isinstance(value, str | None) for value in (user, key, jump)):
        raise ValueError("user, key and jump are strings or null")
    return SshTarget(host, port, user, key, jump=jump), command


class SshRelay(AsyncClosing):
    """Serves rsync's remote shells from pooled connections (owns its socket and the streams
    it relays; async context manager, close() idempotent). `socket_path` exists once started;
    its directory is private to this user. `relayed` counts commands run."""

    def __init__(self, connector: SshConnector) -> None:
        self._connector = connector
        self._server: asyncio.Server | None = None
        self._directory: Path | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.relayed = 0

    async def _enter(self) -> None:
        await self.start()

    @property
    def socket_path(self) -> Path:
        if self._directory is None:
            raise RuntimeError("the SSH relay is not started")
        return self._directory / "relay.sock"

    async def start(self) -> Path:
        """Listen (once); the socket's path."""
        async with self._lock:
            if self._server is None:
                self._directory = Path(tempfile.mkdtemp(prefix="shoal-ssh-relay-"))
                self._server = await asyncio.start_unix_server(
                    self._serve, path=str(self.socket_path)
                )
        return self.socket_path

    async def close(self) -> None:
        """Stop listening, end the relayed commands, remove the socket."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._relay(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            logger.debug("ssh relay: the remote shell went away")
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        try:
            if len(line) > _MAX_HEADER or not line.endswith(b"\n"):
                raise ValueError("no request line")
            target, command = parse_header(line)
        except ValueError as exc:
            writer.write(frame(FAILURE, f"{KIND_CONNECT}: bad relay request: {exc}".encode()))
            return
        where = f"{target.host}:{target.port}"
        try:
            async with self._connector(target) as conn:
                process = await conn.create_process(command, encoding=None)
                self.relayed += 1
                status = await _pump(process, reader, writer)
        except SshHostKeyError as exc:
            writer.write(frame(FAILURE, f"{KIND_HOST_KEY}: {exc}".encode()))
            return
        except SshAuthError as exc:
            writer.write(frame(FAILURE, f"{KIND_AUTH}: {exc}".encode()))
            return
        except FileTransferError as exc:
            writer.write(frame(FAILURE, f"{KIND_CONNECT}: {exc}".encode()))
            return
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            message = f"{KIND_CONNECT}: {where}: {type(exc).__name__}: {exc}"
            writer.write(frame(FAILURE, message.encode()))
            return
        writer.write(frame(EXIT_STATUS, EXIT.pack(status)))
        await writer.drain()


async def _pump(
    process: asyncssh.SSHClientProcess[bytes],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> int:
    """Stream `process` to and from the helper until it exits; its exit status (255 when it
    ended without one). The helper going away closes the channel, which ends the command."""

    async def stdin() -> None:
        while chunk := await reader.read(_CHUNK):
            process.stdin.write(chunk)
            await process.stdin.drain()
        process.stdin.write_eof()

    async def output(source: asyncssh.SSHReader[bytes], kind: bytes) -> None:
        while chunk := await source.read(_CHUNK):
            writer.write(frame(kind, chunk))
            await writer.drain()

    feeding = asyncio.ensure_future(stdin())
    try:
        await asyncio.gather(output(process.stdout, STDOUT), output(process.stderr, STDERR))
        await process.wait_closed()
    except BaseException:
        process.close()
        raise
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
    status = process.exit_status
    return 255 if status is None or status < 0 else status
