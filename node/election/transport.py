"""The election's transport: net's PeerClient signing each vote, heartbeat and plan request,
each through the peer's `election` breaker (node.election.routes serves them)."""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from config import Timeouts
from config.closing import AsyncClosing
from health import (
    BreakerConfig,
    BreakerRegistry,
    CircuitBreaker,
    CircuitOpenError,
    CircuitState,
)
from net import Identity, NetError, PeerClient, PeerTls, map_peer_errors
from node.election.messages import (
    Heartbeat,
    HeartbeatAck,
    PlanAnnounce,
    VoteReply,
    VoteRequest,
)
from node.election.routes import HEARTBEAT_PATH, PLAN_PATH, VOTE_PATH, AddressOf
from node.errors import ElectionError
from node.plan import PlanFence, RolePlan

log = logging.getLogger(__name__)

T = TypeVar("T")
BREAKER_TRANSPORT = "election"
_Query = tuple[dict[str, str], float] | None  # a GET's query parameters and timeout


def election_breaker_config(base: BreakerConfig, timeouts: Timeouts) -> BreakerConfig:
    """The breaker of a peer's election calls: the node's failure threshold, but open for one
    election timeout at most (`election_min_s`, backoff capped at `election_max_s`), so a peer
    back from a partition hears heartbeats and votes again within seconds, not minutes."""
    return dataclasses.replace(
        base,
        recovery_timeout_s=timeouts.election_min_s,
        max_backoff_s=timeouts.election_max_s,
        probe_timeout_s=timeouts.lease_s,
    )


class _Phase(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


class HttpElectionTransport(AsyncClosing):
    """ElectionTransport over HTTP: signed requests (when a secret is set) to the peer's API at
    `address_of(node_id)`, each through the peer's `election` breaker of `breakers` (configured
    with `breaker_config`), naming `cluster` (this node's cluster id) in X-Shoal-Cluster; any
    failure, timeout, refusal (a node of another cluster answers 403) or open breaker answers
    None."""

    def __init__(
        self,
        node_id: str,
        address_of: AddressOf,
        *,
        secret: bytes | None,
        timeout_s: float,
        peers: PeerClient | None = None,
        breakers: BreakerRegistry | None = None,
        breaker_config: BreakerConfig | None = None,
        cluster: str | None = None,
        tls: PeerTls | None = None,
    ) -> None:
        self.node_id = node_id
        self._cluster = cluster
        self._tls = tls
        self._breakers = breakers
        self._breaker_config = breaker_config
        self._address_of = address_of
        self._secret = secret
        self._timeout_s = timeout_s
        self._peers = peers
        self._owns_client = peers is None
        self._phase = _Phase.UNOPENED

    async def _enter(self) -> None:
        self.open()

    def open(self) -> None:
        """Create the peer client (unless one was given); a closed transport cannot reopen."""
        if self._phase is not _Phase.UNOPENED:
            raise ElectionError(f"election transport is {self._phase.value}")
        if self._peers is None:
            self._peers = PeerClient(
                Identity(self._secret, self.node_id, self._cluster),
                timeouts=Timeouts(http_request_s=self._timeout_s),
                tls=self._tls,
                limit_per_peer=4,
            )
        self._phase = _Phase.OPENED

    async def close(self) -> None:
        """Close the peer client this transport made. Idempotent."""
        self._phase = _Phase.CLOSED
        peers, self._peers = self._peers, None
        if peers is not None and self._owns_client:
            await peers.close()

    async def request_vote(self, to: str, request: VoteRequest) -> VoteReply | None:
        data = await self._post(to, VOTE_PATH, request.to_dict())
        return None if data is None else _parse(VoteReply.from_dict, data, to)

    async def send_heartbeat(self, to: str, heartbeat: Heartbeat) -> HeartbeatAck | None:
        data = await self._post(to, HEARTBEAT_PATH, heartbeat.to_dict())
        return None if data is None else _parse(HeartbeatAck.from_dict, data, to)

    async def fetch_plan(self, to: str, fence: PlanFence, wait_s: float) -> RolePlan | None:
        query = {"fence": fence.to_header(), "wait_s": f"{wait_s:g}"}
        data = await self._post(to, PLAN_PATH, None, (query, self._timeout_s + wait_s))
        announce = None if data is None else _parse(PlanAnnounce.from_dict, data, to)
        return None if announce is None else announce.plan

    async def _post(
        self, to: str, path: str, body: Mapping[str, object] | None, query: _Query = None
    ) -> Any:
        if self._phase is not _Phase.OPENED or self._peers is None:
            raise ElectionError(f"election transport is {self._phase.value}")
        endpoint = self._address_of(to)
        if endpoint is None:
            return None
        host, port = endpoint
        address = f"{_host(host)}:{port}"
        breaker = self._breaker(to)
        try:
            if breaker is None:
                return await self._exchange(self._peers, to, address, path, body, query)
            async with breaker:
                return await self._exchange(self._peers, to, address, path, body, query)
        except CircuitOpenError as exc:
            log.debug("node %s: %s %s skipped: %s", self.node_id, to, path, exc)
            return None
        except NetError as exc:
            log.debug("node %s: %s %s failed: %r", self.node_id, to, path, exc)
            return None

    def _breaker(self, peer: str) -> CircuitBreaker | None:
        if self._breakers is None:
            return None
        breaker = self._breakers.breaker_for(peer, BREAKER_TRANSPORT)
        if self._breaker_config is not None and breaker.config is not self._breaker_config:
            breaker.reconfigure(self._breaker_config)
            if breaker.state is CircuitState.CLOSED:
                breaker.reset()  # start from this config's recovery time, not the default's
        return breaker

    async def _exchange(
        self,
        peers: PeerClient,
        to: str,
        address: str,
        path: str,
        body: Mapping[str, object] | None,
        query: _Query = None,
    ) -> Any:
        """POST `body` (GET without one); the JSON answer, None for a refusal (the peer
        answered: no failure). Network errors, timeouts and malformed JSON raise (they count on
        the breaker)."""
        method = "GET" if body is None else "POST"
        params, timeout_s = query or (None, None)
        answer = await peers.request(
            method, address, path, json=body, params=params, timeout_s=timeout_s, check=False
        )
        if answer.status != 200:
            log.debug("node %s: %s %s answered %d", self.node_id, to, path, answer.status)
            return None
        with map_peer_errors(peers.base_url(address) + path):
            return answer.json()


def _parse(parser: Callable[[Mapping[str, object]], T], data: object, peer: str) -> T | None:
    if not isinstance(data, dict):
        return None
    try:
        return parser(data)
    except ElectionError as exc:
        log.debug("malformed election answer from %s: %s", peer, exc)
        return None


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
