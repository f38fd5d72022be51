"""Run commands on inventory hosts over SSH (asyncssh): host keys checked against a known_hosts
file, one pooled connection per host (closed after an idle window), bounded concurrency, and
one result per host whatever happens to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import signal
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from config import AsyncClosing, HostEntry, Inventory, Timeouts
from node.errors import (
    SshAuthError,
    SSHConnectError,
    SSHError,
    SshHostKeyError,
    SSHTimeoutError,
)

logger = logging.getLogger(__name__)

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
DEFAULT_COMMAND_TIMEOUT_S = 60.0
DEFAULT_IDLE_S = 60.0
_SPEC = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>[^@:\s]+)(?::(?P<port>\d+))?$")


@dataclass(frozen=True)
class SSHEndpoint:
    """How to open an SSH connection to one host: address, port, user, key, and the name of
    the endpoint to jump through (None: direct)."""

    name: str
    address: str
    port: int = 22
    user: str | None = None
    key_path: str | None = None
    jump: str | None = None

    @property
    def where(self) -> str:
        """`name (address:port)`, as error messages name the host."""
        return f"{self.name} ({self.address}:{self.port})"


@dataclass(frozen=True)
class SSHResult:
    """What one command did on one host. `error` is None when the command ran (whatever its
    exit code); otherwise it says why it did not run or did not finish, and `exit_code` is None."""

    host: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The command ran and exited 0."""
        return self.error is None and self.exit_code == 0

    def as_dict(self) -> dict[str, object]:
        """The JSON shape of `shoal ssh run --json`."""
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "duration_s": round(self.duration_s, 6),
            "error": self.error,
        }


def parse_ssh_spec(spec: str) -> SSHEndpoint:
    """An endpoint of `[user@]host[:port]`; ValueError when `spec` is not of that form."""
    match = _SPEC.match(spec.strip())
    if match is None:
        raise ValueError(f"{spec!r} is not an SSH target of the form [user@]host[:port]")
    port = int(match.group("port") or 22)
    return SSHEndpoint(name=spec, address=match.group("host"), port=port, user=match["user"])


def endpoint_of(name: str, entry: HostEntry) -> SSHEndpoint:
    """The SSH endpoint of inventory host `name` (ssh_host, else tailscale_ip)."""
    return SSHEndpoint(
        name=name,
        address=entry.ssh_host or entry.address,
        port=entry.ssh_port,
        user=entry.ssh_user,
        key_path=entry.ssh_key,
        jump=entry.proxy_jump,
    )


def command_line(command: str | Sequence[str]) -> str:
    """The remote command line: a string as given, an argv list quoted for the remote shell."""
    return command if isinstance(command, str) else shlex.join(command)


def translate_ssh_error(exc: BaseException, endpoint: SSHEndpoint, known_hosts: Path) -> SSHError:
    """The SSHError for an error of asyncssh or the OS while connecting to `endpoint`."""
    where = endpoint.where
    if isinstance(exc, SSHError):
        return exc
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return SshHostKeyError(
            f"{where}: host key unknown or changed, not verifiable against {known_hosts} "
            f"({exc.reason}); check the key with `shoal ssh trust {endpoint.name}`, then add it "
            f"with `shoal ssh trust {endpoint.name} --yes`"
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return SshAuthError(
            f"{where}: user {endpoint.user or '(local user)'} with key "
            f"{endpoint.key_path or '(default keys)'} refused ({exc.reason}); add the public key "
            "to the host's authorized_keys or set ssh_key/ssh_user in the inventory"
        )
    if isinstance(exc, TimeoutError):
        return SSHTimeoutError(f"{where}: no SSH connection in time (timed out)")
    if isinstance(exc, OSError):
        return SSHConnectError(f"{where}: unreachable: {exc.strerror or exc}")
    if isinstance(exc, asyncssh.Error):
        return SSHConnectError(f"{where}: SSH failed: {exc.reason}")
    return SSHConnectError(f"{where}: {type(exc).__name__}: {exc}")


@dataclass
class _Pooled:
    conn: asyncssh.SSHClientConnection
    last_used: float
    jump: str | None = None
    users: int = 0


class SSHPool(AsyncClosing):
    """One SSH connection per endpoint name, reused until idle for `idle_s` (owns them; async
    context manager, close() idempotent and final). `connects` counts connections opened."""

    def __init__(
        self,
        known_hosts: Path | str = DEFAULT_KNOWN_HOSTS,
        *,
        connect_timeout_s: float | None = None,
        idle_s: float = DEFAULT_IDLE_S,
    ) -> None:
        self.known_hosts = Path(known_hosts).expanduser()
        self.connect_timeout_s = connect_timeout_s or Timeouts().ssh_connect_s
        self.idle_s = idle_s
        self.connects = 0
        self._pooled: dict[str, _Pooled] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    def _expire(self, now: float) -> None:
        """Close connections idle for idle_s: none in use by a command, none a live
        connection tunnels through."""
        for name, pooled in list(self._pooled.items()):
            idle = now - pooled.last_used > self.idle_s and pooled.users == 0
            if pooled.conn.is_closed() or (idle and pooled.jump is not None):
                del self._pooled[name]
                pooled.conn.close()
        tunnels = {p.jump for p in self._pooled.values() if p.jump is not None}
        for name, pooled in list(self._pooled.items()):
            idle = now - pooled.last_used > self.idle_s and pooled.users == 0
            if idle and name not in tunnels:
                del self._pooled[name]
                pooled.conn.close()

    @contextlib.asynccontextmanager
    async def lease(
        self,
        endpoint: SSHEndpoint,
        resolve: Mapping[str, SSHEndpoint] | None = None,
        *,
        reuse: bool = True,
    ) -> AsyncIterator[asyncssh.SSHClientConnection]:
        """A connection to `endpoint` for the block: the pooled one, never expired while
        leased (`reuse=False`: a new one, closed after the block). Raises SSHError."""
        if not reuse:
            conn = await self.connection(endpoint, resolve, reuse=False)
            try:
                yield conn
            finally:
                conn.close()
            return
        conn = await self.connection(endpoint, resolve)
        pooled = self._pooled.get(endpoint.name)
        if pooled is not None:
            pooled.users += 1
        try:
            yield conn
        finally:
            if pooled is not None:
                pooled.users -= 1
                pooled.last_used = time.monotonic()

    async def connection(
        self,
        endpoint: SSHEndpoint,
        resolve: Mapping[str, SSHEndpoint] | None = None,
        *,
        reuse: bool = True,
    ) -> asyncssh.SSHClientConnection:
        """The pooled connection to `endpoint` (opened, through its jump host, if needed).

        `resolve` maps jump names to endpoints (inventory hosts); a jump that is not there is
        parsed as `[user@]host[:port]`. Raises SSHError. `reuse=False` always opens a new one
        (the caller then owns and closes it)."""
        if self._closed:
            raise SSHConnectError(f"{endpoint.where}: the SSH pool is closed")
        now = time.monotonic()
        self._expire(now)
        if not reuse:
            return await self._open(endpoint, resolve or {}, ())
        lock = self._locks.setdefault(endpoint.name, asyncio.Lock())
        async with lock:
            pooled = self._pooled.get(endpoint.name)
            if pooled is None:
                conn = await self._open(endpoint, resolve or {}, ())
                pooled = self._pooled[endpoint.name] = _Pooled(conn, now, endpoint.jump)
            pooled.last_used = time.monotonic()
            return pooled.conn

    async def _open(
        self, endpoint: SSHEndpoint, resolve: Mapping[str, SSHEndpoint], seen: tuple[str, ...]
    ) -> asyncssh.SSHClientConnection:
        tunnel: asyncssh.SSHClientConnection | None = None
        if endpoint.jump:
            if endpoint.jump in seen or endpoint.jump == endpoint.name:
                raise SSHConnectError(f"{endpoint.where}: proxy_jump loops through {endpoint.jump}")
            try:
                jump = resolve.get(endpoint.jump) or parse_ssh_spec(endpoint.jump)
            except ValueError as exc:
                raise SSHConnectError(
                    f"{endpoint.where}: proxy_jump {endpoint.jump!r} is neither an inventory "
                    "host nor [user@]host[:port]"
                ) from exc
            try:
                tunnel = await self.connection(jump, resolve)
            except SSHError as exc:
                raise type(exc)(f"{endpoint.name} via proxy_jump {exc}") from exc
        keys = _client_keys(endpoint)
        if not _is_file(self.known_hosts):
            raise SshHostKeyError(
                f"{endpoint.where}: known_hosts file {self.known_hosts} is missing, so no host "
                f"key can be checked; `shoal ssh trust {endpoint.name} --yes` creates it"
            )
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                conn = await asyncssh.connect(
                    endpoint.address,
                    port=endpoint.port,
                    username=endpoint.user or (),
                    known_hosts=str(self.known_hosts),
                    client_keys=keys,
                    tunnel=tunnel if tunnel is not None else (),
                    config=[],
                    kbdint_auth=False,
                    password_auth=False,
                    preferred_auth="publickey",
                    connect_timeout=self.connect_timeout_s,
                    keepalive_interval=self.connect_timeout_s,
                )
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise translate_ssh_error(exc, endpoint, self.known_hosts) from exc
        self.connects += 1
        return conn

    def discard(self, name: str) -> None:
        """Close and forget the pooled connection of `name` (after it failed)."""
        pooled = self._pooled.pop(name, None)
        if pooled is not None:
            pooled.conn.close()

    async def close(self) -> None:
        """Close every pooled connection; the pool opens none afterwards."""
        self._closed = True
        pooled, self._pooled = list(self._pooled.values()), {}
        for entry in pooled:
            entry.conn.close()
        for entry in pooled:
            await entry.conn.wait_closed()


class SSHExecutor(AsyncClosing):
    """Runs commands on the hosts of an inventory (owns an SSHPool; async context manager).

    Hosts are inventory names, or `[user@]host[:port]` specs for hosts outside it. At most
    `max_concurrency` commands run at once."""

    def __init__(
        self,
        inventory: Inventory | None = None,
        known_hosts: Path | str = DEFAULT_KNOWN_HOSTS,
        max_concurrency: int = 16,
        *,
        timeouts: Timeouts | None = None,
        idle_s: float = DEFAULT_IDLE_S,
        reuse: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.inventory = inventory or Inventory.model_construct(hosts={})
        timeouts = timeouts or Timeouts()
        self.pool = SSHPool(known_hosts, connect_timeout_s=timeouts.ssh_connect_s, idle_s=idle_s)
        self.reuse = reuse
        self._slots = asyncio.Semaphore(max_concurrency)
        self._endpoints = {name: endpoint_of(name, h) for name, h in self.inventory.hosts.items()}

    async def close(self) -> None:
        """Close every pooled connection (idempotent)."""
        await self.pool.close()

    @property
    def known_hosts(self) -> Path:
        """The known_hosts file host keys are checked against."""
        return self.pool.known_hosts

    @property
    def endpoints(self) -> Mapping[str, SSHEndpoint]:
        """The endpoint of every inventory host, by name."""
        return self._endpoints

    def endpoint(self, host: str) -> SSHEndpoint:
        """The endpoint of inventory host `host`, else of the spec `host`; SSHError if neither."""
        found = self._endpoints.get(host)
        if found is not None:
            return found
        try:
            return parse_ssh_spec(host)
        except ValueError as exc:
            known = ", ".join(sorted(self._endpoints)) or "none"
            raise SSHConnectError(
                f"{host}: not a host of the inventory (hosts: {known}) nor [user@]host[:port]"
            ) from exc

    def lease(
        self, host: str
    ) -> contextlib.AbstractAsyncContextManager[asyncssh.SSHClientConnection]:
        """`async with executor.lease(host) as conn`: the pooled connection to `host` for the
        block (SFTP, several channels); raises SSHError."""
        return self.pool.lease(self.endpoint(host), self._endpoints)

    async def run(
        self,
        host: str,
        command: str | Sequence[str],
        timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
        *,
        input_text: str | None = None,
    ) -> SSHResult:
        """Run `command` on `host`; never raises for the host's failures (see SSHResult.error)."""
        async with self._slots:
            return await self._run(host, command, timeout_s, input_text)

    async def _run(
        self, host: str, command: str | Sequence[str], timeout_s: float, input_text: str | None
    ) -> SSHResult:
        started = time.monotonic()

        def failed(error: str) -> SSHResult:
            return SSHResult(host, None, "", "", time.monotonic() - started, error)

        line = command_line(command)
        try:
            endpoint = self.endpoint(host)
            async with self.pool.lease(endpoint, self._endpoints, reuse=self.reuse) as conn:
                try:
                    async with asyncio.timeout(timeout_s):
                        done = await conn.run(line, check=False, input=input_text)
                except TimeoutError:
                    self.pool.discard(endpoint.name)
                    return failed(
                        f"{endpoint.where}: command did not finish in {timeout_s:g}s: {line}"
                    )
                except (OSError, asyncssh.Error) as exc:
                    self.pool.discard(endpoint.name)
                    return failed(str(translate_ssh_error(exc, endpoint, self.known_hosts)))
        except SSHError as exc:
            return failed(str(exc))
        exit_code = done.exit_status
        if exit_code is None or exit_code < 0:
            exit_code = 128 + _signal_number(done.exit_signal)
        return SSHResult(
            host,
            exit_code,
            _text(done.stdout),
            _text(done.stderr),
            time.monotonic() - started,
        )

    async def run_parallel(
        self,
        hosts: Iterable[str],
        command: str | Sequence[str],
        timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
    ) -> dict[str, SSHResult]:
        """Run `command` on every host at once (at most max_concurrency at a time); one result
        per host, in the order given."""
        names = list(dict.fromkeys(hosts))
        results = await asyncio.gather(*(self.run(h, command, timeout_s) for h in names))
        return dict(zip(names, results, strict=True))


def _is_file(path: Path) -> bool:
    return path.is_file()


def _client_keys(endpoint: SSHEndpoint) -> list[str] | tuple[()]:
    """The endpoint's key file (`~` expanded), or () for asyncssh's default keys."""
    return [os.path.expanduser(endpoint.key_path)] if endpoint.key_path else ()


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _signal_number(exit_signal: tuple[str, bool, str, str] | None) -> int:
    """The number of the signal that ended a remote command (0 when unknown)."""
    if not exit_signal:
        return 0
    try:
        return int(signal.Signals[f"SIG{exit_signal[0]}"])
    except KeyError:
        return 0
