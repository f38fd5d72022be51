"""What deploy asks the cluster over HTTP, signed with the cluster secret: a member's
/v1/status and /v1/peers (for the rolling upgrade's checks), and the audit record of a deploy
on the host's own daemon (POST /v1/audit/deploys)."""

from __future__ import annotations

import getpass
import socket
from typing import Any, NotRequired, TypedDict

from config import AsyncClosing, HostEntry, Inventory
from net import Identity, PeerClient, PeerRequestError, peer_url
from node.ssh.deploy import DeployResult
from node.ssh.rolling import MemberStatus

PROBE_TIMEOUT_S = 5.0
DEPLOYS_PATH = "/v1/audit/deploys"
_RECORDED = ("installed", "upgraded")


def base_url(entry: HostEntry) -> str:
    """The daemon of a host, through its inventory address."""
    return peer_url(entry.address, entry.p2p_port)


def operator_name() -> str:
    """`user@machine` of whoever runs deploy (a claim for the record; the signed sender is
    the proof)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


class DeployRecordJson(TypedDict):
    """The body of POST /v1/audit/deploys: one deploy to a host; `certificate` (serial and
    expiry) only when it issued the host a certificate."""

    host: str
    status: str
    version: str
    fingerprint: str
    rolling: bool
    duration_s: float
    operator: str
    certificate: NotRequired[dict[str, object]]


def deploy_record(result: DeployResult, *, rolling: bool) -> DeployRecordJson | None:
    """The body of POST /v1/audit/deploys for `result`; None when there is nothing to record
    (unchanged, failed or a dry run)."""
    if result.dry_run or result.status not in _RECORDED:
        return None
    body = DeployRecordJson(
        host=result.host,
        status=result.status,
        version=result.version or "unknown",
        fingerprint=result.fingerprint or "",
        rolling=rolling,
        duration_s=round(result.duration_s, 3),
        operator=operator_name(),
    )
    certificate = result.certificate
    if certificate is not None and certificate.get("issued"):
        body["certificate"] = {
            "serial": certificate["serial"],
            "not_after": certificate["not_after"],
        }
    return body


class HttpClusterProbe(AsyncClosing):
    """Signed GETs of members' status and peers, and POSTs of deploy records through net's
    peer client; every request bounded by `timeout_s`. An async context manager."""

    def __init__(
        self,
        inventory: Inventory,
        secret: bytes,
        *,
        sender: str | None = None,
        timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._inventory = inventory
        identity = Identity(secret, sender or f"cli-{socket.gethostname()}")
        self._client = PeerClient(identity)
        self._timeout_s = timeout_s

    async def close(self) -> None:
        """Close the peer client's sessions (idempotent)."""
        await self._client.close()

    async def _request(self, host: str, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer; PeerRequestError (naming the URL) for an error answer or none."""
        url = base_url(self._inventory.hosts[host])
        return await self._client.request_json(method, url, path, body, timeout_s=self._timeout_s)

    async def member(self, host: str) -> MemberStatus | None:
        """The host's /v1/status and /v1/peers, or None when it did not answer in time."""
        try:
            status = await self._request(host, "GET", "/v1/status")
            peers = await self._request(host, "GET", "/v1/peers")
        except PeerRequestError:
            return None
        alive = frozenset(
            str(m.get("node_id"))
            for m in peers.get("members", [])
            if isinstance(m, dict) and m.get("state") == "alive"
        )
        term = status.get("term")
        return MemberStatus(
            host=host,
            node_id=str(status.get("node_id")),
            coordinator=status.get("coordinator"),
            term=term if isinstance(term, int) else None,
            version=status.get("version"),
            alive=alive,
        )

    async def record(self, host: str, result: DeployResult, *, rolling: bool) -> str | None:
        """Record `result` in the audit trail of the host's daemon; the problem (None: done
        or nothing to record). A deploy is never failed for it."""
        body = deploy_record(result, rolling=rolling)
        if body is None:
            return None
        try:
            await self._request(host, "POST", DEPLOYS_PATH, body)
        except PeerRequestError as exc:
            return str(exc)
        return None
