"""What the dashboard learns from the other members: each alive member's /v1/status (for the
cluster page) and its /v1/weights/runs, every run it knows with its weights (for the pipeline RL
page).

A topic calls `PeerFanout.latest(peers)`: it answers at once with what is known and, when the
last round began `interval_s` or more ago, starts a round in the background: one task per
member that has no request in flight, each within `timeout_s`, all concurrent (at most
MAX_CONCURRENCY at once). A member that does not answer keeps its last answer, marked stale;
it never delays the others nor the event stream, and has at most one request in flight. A topic
is computed only while a page reads it (node.ui.events), so with no page there is no request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from health.errors import FetchError, fetch_error, http_fetch_error
from health.monitor.client import node_url
from health.monitor.model import NodeStatusDoc, parse_status
from net import Identity, PeerRequestError, PeerTls
from net import PeerClient as NetClient
from node.ui.documents import AppliedWeights

log = logging.getLogger(__name__)

T = TypeVar("T")

PEER_INTERVAL_S = 2.0
"""How often the dashboard asks each member while a page reads the topic. bench/ui_bench.py
with 50 members: one page cost 1.07% of a core asking each member once a second, over the 1%
target, and 0.87% every 2 s. A member's death still shows within the second, from the
membership view, not from this fan-out."""
MAX_CONCURRENCY = 64
"""Requests to members in flight at once, over every member of a round."""
NO_WEIGHTS = "no_weights"
"""The error code of /v1/weights/status for a run with no weights on that node yet."""
NOT_FOUND = "not_found"
"""The error code of a route a node does not serve (an older release)."""
WEIGHTS_RUNS_PATH = "/v1/weights/runs"
WEIGHTS_STATUS_PATH = "/v1/weights/status"


@dataclass(frozen=True)
class Peer:
    """A member to ask: its node id and API endpoint."""

    node_id: str
    address: str
    port: int


@dataclass(frozen=True)
class Known(Generic[T]):
    """What is known of one member: its last answer and when it came (unix seconds; None before
    any), and why the last ask failed (None when it answered)."""

    value: T | None = None
    answered_at: float | None = None
    error: str | None = None

    @property
    def stale(self) -> bool:
        """True when the last ask got no answer (the value, if any, is an older one)."""
        return self.error is not None


Ask = Callable[[Peer], Awaitable[Any]]


class PeerFanout(Generic[T]):
    """Asks members with `ask` (which raises FetchError or ValueError for a failed ask) at most
    once per `interval_s`, each within `timeout_s`, concurrently, in the background."""

    def __init__(
        self,
        ask: Callable[[Peer], Awaitable[T]],
        *,
        interval_s: float,
        timeout_s: float,
        max_concurrency: int = MAX_CONCURRENCY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ask = ask
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._limit = asyncio.Semaphore(max(1, max_concurrency))
        self._known: dict[str, Known[T]] = {}
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._round_at = float("-inf")
        self.asked = 0
        """Asks started so far (for tests and the bench)."""

    def known(self) -> dict[str, Known[T]]:
        """What is known of every member now; asks nothing."""
        return dict(self._known)

    def latest(self, peers: Sequence[Peer], keep: Iterable[str] = ()) -> dict[str, Known[T]]:
        """What is known of every member now; starts a round of `peers` when one is due.
        Forgets members neither in `peers` nor in `keep` (gone from the view)."""
        now = time.monotonic()
        if now - self._round_at >= self.interval_s:
            self._round_at = now
            for peer in peers:
                if peer.node_id not in self._inflight:
                    self.asked += 1
                    self._inflight[peer.node_id] = asyncio.create_task(
                        self._ask_one(peer), name=f"ui-peer-{peer.node_id}"
                    )
        wanted = {peer.node_id for peer in peers} | set(keep)
        for gone in set(self._known) - wanted:
            del self._known[gone]
        return dict(self._known)

    async def _ask_one(self, peer: Peer) -> None:
        try:
            async with self._limit:
                async with asyncio.timeout(self.timeout_s):
                    value = await self._ask(peer)
        except TimeoutError:
            self._failed(peer, f"no answer within {self.timeout_s:g} s")
        except FetchError as exc:
            self._failed(peer, exc.reason)
        except ValueError as exc:
            self._failed(peer, f"bad answer: {exc}")
        except Exception as exc:  # one member's odd failure must not end the fan-out
            log.warning("dashboard: asking %s failed: %r", peer.node_id, exc)
            self._failed(peer, repr(exc))
        else:
            self._known[peer.node_id] = Known(value, self._clock(), None)
        finally:
            self._inflight.pop(peer.node_id, None)

    def _failed(self, peer: Peer, reason: str) -> None:
        last = self._known.get(peer.node_id, Known[T]())
        self._known[peer.node_id] = Known(last.value, last.answered_at, reason)

    async def close(self) -> None:
        """Cancel the asks in flight. Idempotent."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._inflight.clear()


class PeerClient:
    """GETs to other members through net's peer client (a kept-alive session per member),
    signed as the daemon's other peer calls are (the cluster secret's signature when there is
    one, the cluster's name). Errors map as cluster_monitor's do: FetchError with the reason a
    row shows."""

    def __init__(
        self, secret: bytes | None, node_id: str, cluster: str | None, *, tls: PeerTls | None = None
    ) -> None:
        self._identity = Identity(secret, node_id, cluster)
        self._tls = tls
        self._peers: NetClient | None = None

    async def get_json(
        self,
        peer: Peer,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        none_for: str = NO_WEIGHTS,
    ) -> Any:
        """The JSON body of GET `path` on `peer`; None for a 404 whose code is `none_for`;
        FetchError otherwise. The caller bounds the time (PeerFanout's timeout)."""
        if self._peers is None:
            self._peers = NetClient(self._identity, tls=self._tls, limit_per_peer=4)
        try:
            response = await self._peers.request(
                "GET", node_url(peer.address, peer.port), path, params=params, check=False
            )
        except PeerRequestError as exc:
            raise fetch_error(exc, 0.0) from exc
        status, body = response.status, response.body
        if status == 404 and _error_code(body) == none_for:
            return None
        if status >= 400:
            raise http_fetch_error(status, body)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise FetchError(f"bad response: not JSON ({exc})") from exc

    async def close(self) -> None:
        peers, self._peers = self._peers, None
        if peers is not None:
            await peers.close()


def _error_code(body: bytes) -> str | None:
    """The `error` code of a node's error answer ({"error": CODE, "reason": ...})."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    code = document.get("error") if isinstance(document, Mapping) else None
    return code if isinstance(code, str) else None


async def ask_status(client: PeerClient, peer: Peer) -> NodeStatusDoc:
    """A member's /v1/status, parsed as cluster_monitor parses it."""
    return parse_status(await client.get_json(peer, "/v1/status"))


Applied = AppliedWeights | None
"""A member's weights of one run as the RL page shows them: version, applied_at and source
(None: the run is known there, nothing applied yet)."""


def _applied(run: str, status: object) -> Applied:
    """AppliedWeights from a member's weights status of `run` (None: nothing applied); a
    ValueError names the field that is missing or of the wrong type."""
    if status is None:
        return None
    if not isinstance(status, Mapping) or not isinstance(status.get("version"), int):
        raise ValueError(f"weights status of run {run!r} has no integer version")
    applied_at = status.get("applied_at")
    if applied_at is not None and not isinstance(applied_at, int | float):
        raise ValueError(f"weights status of run {run!r}: applied_at is not a number")
    source = status.get("source")
    if source is not None and not isinstance(source, str):
        raise ValueError(f"weights status of run {run!r}: source is not a string")
    return {"version": status["version"], "applied_at": applied_at, "source": source}


async def ask_weights(client: PeerClient, peer: Peer, runs: Sequence[str]) -> dict[str, Applied]:
    """A member's applied weights of every run it knows, in one ask (GET /v1/weights/runs).
    A member of an older release, without that route, is asked per run of `runs` (the runs
    this node knows) with GET /v1/weights/status?run=R, at once."""
    answer = await client.get_json(peer, WEIGHTS_RUNS_PATH, none_for=NOT_FOUND)
    if answer is not None:
        known = answer.get("runs") if isinstance(answer, Mapping) else None
        if not isinstance(known, Mapping):
            raise ValueError(f"{WEIGHTS_RUNS_PATH} answered no runs object")
        return {str(run): _applied(str(run), status) for run, status in known.items()}

    async def one(run: str) -> Applied:
        return _applied(run, await client.get_json(peer, WEIGHTS_STATUS_PATH, {"run": run}))

    answers = await asyncio.gather(*(one(run) for run in runs))
    return dict(zip(runs, answers, strict=True))
