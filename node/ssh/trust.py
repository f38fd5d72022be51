"""`shoal ssh trust`: fetch a host's key, show its fingerprint, add it to known_hosts on request."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from node.errors import SSHError, SshHostKeyError
from node.ssh.executor import SSHEndpoint, SSHPool, parse_ssh_spec, translate_ssh_error

TRUSTED = "trusted"
UNKNOWN = "unknown"
CHANGED = "changed"


@dataclass(frozen=True)
class HostKeyInfo:
    """A host's key as the host presents it, and how it stands against known_hosts."""

    host: str
    pattern: str
    key_line: str
    fingerprint: str
    status: str


def known_hosts_pattern(endpoint: SSHEndpoint) -> str:
    """The known_hosts host field of `endpoint`: `address`, or `[address]:port` off port 22."""
    if endpoint.port == 22:
        return endpoint.address
    return f"[{endpoint.address}]:{endpoint.port}"


def key_status(known_hosts: Path, endpoint: SSHEndpoint, key: asyncssh.SSHKey) -> str:
    """TRUSTED when known_hosts holds `key` for the endpoint, CHANGED when it holds another
    key for it, UNKNOWN when it holds none."""
    if not known_hosts.is_file():
        return UNKNOWN
    try:
        matched = asyncssh.read_known_hosts(str(known_hosts)).match(
            endpoint.address, endpoint.address, endpoint.port
        )
    except (OSError, ValueError, asyncssh.Error) as exc:
        raise SshHostKeyError(f"{known_hosts}: not a readable known_hosts file: {exc}") from exc
    trusted = matched[0]
    if not trusted:
        return UNKNOWN
    wanted = key.public_data
    return TRUSTED if any(k.public_data == wanted for k in trusted) else CHANGED


async def fetch_host_key(
    pool: SSHPool, endpoint: SSHEndpoint, resolve: Mapping[str, SSHEndpoint] | None = None
) -> HostKeyInfo:
    """The key `endpoint` presents (through its jump host, whose own key must be trusted)."""
    tunnel: asyncssh.SSHClientConnection | None = None
    if endpoint.jump:
        jump = (resolve or {}).get(endpoint.jump)
        if jump is None:
            jump = parse_ssh_spec(endpoint.jump)
        tunnel = await pool.connection(jump, resolve)
    try:
        async with asyncio.timeout(pool.connect_timeout_s):
            key = await asyncssh.get_server_host_key(
                endpoint.address,
                endpoint.port,
                tunnel=tunnel if tunnel is not None else (),
                config=[],
            )
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise translate_ssh_error(exc, endpoint, pool.known_hosts) from exc
    if key is None:
        raise SSHError(f"{endpoint.where}: presented no host key")
    pattern = known_hosts_pattern(endpoint)
    return HostKeyInfo(
        host=endpoint.name,
        pattern=pattern,
        key_line=f"{pattern} {key.export_public_key('openssh').decode().strip()}",
        fingerprint=key.get_fingerprint("sha256"),
        status=key_status(pool.known_hosts, endpoint, key),
    )


def add_host_key(known_hosts: Path, info: HostKeyInfo) -> None:
    """Write `info`'s key into known_hosts (created mode 600), replacing plain lines of the same
    host pattern (a changed key); hashed lines are left alone."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    kept: list[str] = []
    if known_hosts.is_file():
        for line in known_hosts.read_text().splitlines():
            fields = line.split()
            if fields and info.pattern in fields[0].split(","):
                continue
            kept.append(line)
    kept.append(info.key_line)
    temp = known_hosts.with_name(f".{known_hosts.name}.shoal-tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(kept) + "\n")
        out.flush()
        os.fsync(out.fileno())
    temp.replace(known_hosts)
