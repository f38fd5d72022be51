"""Real OpenSSH servers for tests: one `sshd -D` per host (own host key, authorized_keys and
port), on loopback or inside a netns host; and running a coroutine inside a host's namespace.

The harness kills every process of a namespace when it closes, so netns sshds end with their
cluster; loopback sshds are stopped by `SshServer.stop()` (the fixtures call it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import asyncssh
import pytest

from tests.cluster.cluster import HarnessError, Host

__all__ = [
    "SSHD",
    "ClientKey",
    "SshServer",
    "make_client_key",
    "requires_sshd",
    "run_in_namespace",
    "sshd_unavailable_reason",
    "start_sshd",
]

SSHD = Path("/usr/sbin/sshd")
_CLONE_NEWNET = 0x40000000
_START_TIMEOUT_S = 15.0
T = TypeVar("T")


def requires_sshd() -> pytest.MarkDecorator:
    """A mark that skips a test when no real sshd can run here, saying why."""
    reason = sshd_unavailable_reason()
    return pytest.mark.skipif(reason is not None, reason=f"needs a real sshd: {reason}")


def sshd_unavailable_reason() -> str | None:
    """Why a real sshd cannot run here, or None."""
    if not SSHD.is_file():
        return f"{SSHD} not found (install openssh-server; .ci/sysdeps.sh does as root)"
    if os.geteuid() != 0:
        return f"sshd tests run as root (uid {os.geteuid()})"
    return None


@dataclass(frozen=True)
class ClientKey:
    """An ed25519 client key pair on disk (private key mode 600)."""

    path: Path
    public_line: str


def make_client_key(directory: Path, name: str = "client_ed25519") -> ClientKey:
    """A new client key in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519")
    path = directory / name
    key.write_private_key(str(path))
    path.chmod(0o600)
    return ClientKey(path, key.export_public_key().decode().strip())


@dataclass
class SshServer:
    """One running sshd: where it listens, its host key line for known_hosts, its process."""

    name: str
    address: str
    port: int
    directory: Path
    host_key: asyncssh.SSHKey
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def known_hosts_line(self, key: asyncssh.SSHKey | None = None) -> str:
        """The known_hosts line of this server (or of another `key` at its address)."""
        pattern = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{pattern} {(key or self.host_key).export_public_key().decode().strip()}"

    def stop(self) -> None:
        """Stop a loopback sshd (netns sshds die with their namespace)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def _config(directory: Path, address: str, port: int) -> Path:
    config = directory / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress {address}",
                f"Port {port}",
                f"HostKey {directory / 'host_ed25519'}",
                f"AuthorizedKeysFile {directory / 'authorized_keys'}",
                "PidFile none",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "AllowTcpForwarding yes",
                "MaxSessions 64",
                "MaxStartups 200",
                "Subsystem sftp internal-sftp",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    return config


def _listening(port: int, host: Host | None) -> bool:
    argv = ["ss", "-Hltn", f"sport = :{port}"]
    if host is not None:
        argv = host.command(argv)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    return bool(result.stdout.strip())


def start_sshd(
    directory: Path,
    authorized_keys: list[str],
    *,
    host: Host | None = None,
    address: str = "127.0.0.1",
    port: int = 22,
    name: str = "sshd",
) -> SshServer:
    """Start sshd listening on `address:port` (inside `host`'s namespace when given) and wait
    until it listens. Raises HarnessError when it does not start."""
    reason = sshd_unavailable_reason()
    if reason is not None:
        raise HarnessError(reason)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    directory.mkdir(parents=True, exist_ok=True)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = directory / "host_ed25519"
    host_key.write_private_key(str(key_path))
    key_path.chmod(0o600)
    (directory / "authorized_keys").write_text("\n".join(authorized_keys) + "\n")
    if host is not None:
        address = host.address
    config = _config(directory, address, port)
    argv = [str(SSHD), "-D", "-e", "-f", str(config)]
    server = SshServer(name, address, port, directory, host_key)
    if host is not None:
        host.spawn(argv, name=name)
    else:
        log = (directory / "sshd.log").open("wb")
        server.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not _listening(port, host):
        if server.process is not None and server.process.poll() is not None:
            raise HarnessError(f"sshd exited {server.process.returncode}: see {directory}")
        if time.monotonic() > deadline:
            server.stop()
            raise HarnessError(f"sshd {name} not listening on {address}:{port} in time")
        time.sleep(0.05)
    return server


def run_in_namespace(ns: str | None, factory: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """Run `asyncio.run(factory())` in a thread whose network namespace is `ns` (None: this
    one), so every socket it opens is inside that host. Bounded by `timeout_s`."""

    def body() -> T:
        if ns is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise HarnessError(f"setns {ns}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)

        async def bounded() -> T:
            async with asyncio.timeout(timeout_s):
                return await factory()

        return asyncio.run(bounded())

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(body).result(timeout=timeout_s + 30)
