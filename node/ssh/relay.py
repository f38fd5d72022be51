"""The rsync transport on the node's SSH pool: a connector that leases pooled connections
for the transport's relay (sync.transports.ssh_relay), so rsync transfers from a host share one
connection, closed after the pool's idle window."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

import asyncssh

import node.errors
from node.errors import SSHError
from node.ssh.executor import SSHEndpoint, SSHPool
from sync import FileTransferError, SshAuthError, SshConnector, SshHostKeyError, SshTarget


def target_endpoint(target: SshTarget) -> SSHEndpoint:
    """The pool endpoint of an rsync target, named `[user@]host:port`."""
    user = f"{target.user}@" if target.user else ""
    return SSHEndpoint(
        name=f"{user}{target.host}:{target.port}",
        address=target.host,
        port=target.port,
        user=target.user,
        key_path=target.key_path,
        jump=target.jump,
    )


def pooled_connector(
    pool: SSHPool, resolve: Mapping[str, SSHEndpoint] | None = None
) -> SshConnector:
    """A connector leasing from `pool`; `resolve` names the inventory's endpoints for jumps.
    A connection that fails under a command is dropped from the pool."""

    @contextlib.asynccontextmanager
    async def connect(target: SshTarget) -> AsyncIterator[asyncssh.SSHClientConnection]:
        endpoint = target_endpoint(target)
        try:
            async with pool.lease(endpoint, resolve) as conn:
                try:
                    yield conn
                except (OSError, asyncssh.Error):
                    pool.discard(endpoint.name)
                    raise
        except node.errors.SshHostKeyError as exc:
            raise SshHostKeyError(str(exc)) from exc
        except node.errors.SshAuthError as exc:
            raise SshAuthError(str(exc)) from exc
        except SSHError as exc:
            raise FileTransferError(str(exc)) from exc

    return connect
