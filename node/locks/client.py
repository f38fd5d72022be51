"""The lock client: `async with cluster_lock("training", holder=..., ttl_s=...) as fence:` waits
its turn in the lock's FIFO queue, renews the lease while the body runs, and releases on exit.
If the lease is lost (no renewal reached the coordinator in time) the body is cancelled and
LockLostError raised: a holder never keeps acting on a lock it lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypedDict

from config.closing import AsyncClosing
from net import Identity, PeerClient, PeerRequestError
from node.errors import LockError, LockLostError, LockUnavailableError
from node.locks.table import LockAnswer, LockFence


class AcquireJson(TypedDict):
    """The body of an acquire (node.locks.wire.AcquireBody) this client sends."""

    holder: str
    ttl_s: float
    wait: bool
    wait_s: float


class HolderJson(TypedDict):
    """The body of a renew or a release (node.locks.wire.HolderBody): the grant's fence."""

    holder: str
    fence: list[int]


log = logging.getLogger(__name__)

RETRY_S = 0.2
REQUEST_TIMEOUT_S = 5.0
DEFAULT_URL = "http://127.0.0.1:8420"


def default_holder() -> str:
    """`host:pid:random`: unique per process and per call."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LockClient(AsyncClosing):
    """Lock requests to any of `urls` (each forwards to the coordinator); tries the next node
    when one does not answer, retries while there is no coordinator or quorum."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        secret: bytes | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        if not urls:
            raise LockError(400, "no_node", "cluster_lock needs at least one node URL")
        self.urls = tuple(u.rstrip("/") for u in urls)
        self._secret = secret
        self._timeout_s = request_timeout_s
        self._peers: PeerClient | None = None
        self._next = 0

    async def _enter(self) -> None:
        self._peers = PeerClient(Identity(self._secret, "cli-locks"))

    async def close(self) -> None:
        """Close the peer client; idempotent."""
        if self._peers is not None:
            await self._peers.close()
            self._peers = None

    async def call(
        self,
        name: str,
        op: str,
        body: AcquireJson | HolderJson,
        deadline: float,
        extra_s: float = 0.0,
    ) -> dict[str, object]:
        """POST /v1/locks/{name}/{op} until an answer other than 503 or `deadline` passes."""
        answer, _ = await self.call_timed(name, op, body, deadline, extra_s)
        return answer

    async def call_timed(
        self,
        name: str,
        op: str,
        body: AcquireJson | HolderJson,
        deadline: float,
        extra_s: float = 0.0,
    ) -> tuple[dict[str, object], float]:
        """`call`, with the monotonic time the answered attempt was sent: the coordinator
        changed the lock no earlier than that, so a lease it granted runs at least ttl_s from it.

        A node that answers 503 (no coordinator or no quorum where it stands) or does not answer
        at all is left for the next of `urls`: a partitioned node may stay unable for long."""
        assert self._peers is not None, "use LockClient in `async with`"
        last = "no attempt"
        while True:
            base = self.urls[self._next % len(self.urls)]
            path = f"/v1/locks/{name}/{op}"
            sent_at = time.monotonic()
            try:
                answer = await self._peers.request_json(
                    "POST", base, path, body, timeout_s=self._timeout_s + extra_s
                )
                return dict(answer), sent_at
            except PeerRequestError as exc:  # the node's refusal is the lock's; else next node
                if exc.status is not None and exc.status != 503:
                    raise LockError(exc.status, str(exc.code), exc.reason) from exc
                last = f"{base}{path}: {exc.reason}"
            self._next += 1
            if time.monotonic() >= deadline:
                raise LockUnavailableError(503, "lock_unavailable", f"lock {name!r} {op}: {last}")
            await asyncio.sleep(RETRY_S)


async def _acquire(
    client: LockClient,
    name: str,
    body: AcquireJson,
    ttl_s: float,
    timeout_s: float | None,
    ask_s: float,
    on_position: Callable[[int], None] | None,
) -> tuple[LockFence, float]:
    """Ask for `name` until granted: (the grant's fence, when the granting request was sent);
    LockUnavailableError once `timeout_s` has passed."""
    start = time.monotonic()
    while True:
        deadline = start + timeout_s if timeout_s is not None else math.inf
        answered, sent_at = await client.call_timed(
            name, "acquire", body, min(deadline, time.monotonic() + ttl_s), ask_s
        )
        answer = LockAnswer.from_dict(answered)
        if answer.granted:
            break
        if on_position is not None and answer.position is not None:
            on_position(answer.position)
        if timeout_s is not None and time.monotonic() - start >= timeout_s:
            raise LockUnavailableError(
                503, "lock_wait_timeout", f"lock {name!r}: not granted within {timeout_s:g} s"
            )
    fence = answer.fence
    if fence is None:
        raise LockError(502, "bad_lock_answer", f"lock {name!r}: granted without a fence")
    return fence, sent_at


async def _keep(
    client: LockClient,
    name: str,
    renew: HolderJson,
    lease_end: float,
    ttl_s: float,
    leaving: asyncio.Event,
    lost: list[str],
    body_task: asyncio.Task[Any] | None,
) -> None:
    """Renew the lease ending at `lease_end` once a third of it has run, until `leaving` is
    set; when a renewal cannot get through before the lease (less a margin) ends, append why
    to `lost` and cancel `body_task`."""
    margin_s = min(1.0, ttl_s / 4)
    # `leaving` as well as cancel(): a cancel that lands as a renewal completes can be
    # lost (asyncio.wait_for on 3.11), and a keeper that outlived its body would renew
    # a lock nobody uses, forever.
    while not leaving.is_set():
        # renew once a third of the lease has run
        await asyncio.sleep(max(0.0, lease_end - 2 * ttl_s / 3 - time.monotonic()))
        if leaving.is_set():
            return
        asked = time.monotonic()
        give_up_at = lease_end - margin_s
        try:
            async with asyncio.timeout(max(0.0, give_up_at - asked)):
                await client.call(name, "renew", renew, give_up_at)
            lease_end = asked + ttl_s
        except (LockError, TimeoutError) as exc:
            lost.append(getattr(exc, "reason", "") or "no renewal reached the coordinator")
            assert body_task is not None
            body_task.cancel()
            return


@contextlib.asynccontextmanager
async def cluster_lock(
    name: str,
    *,
    holder: str | None = None,
    ttl_s: float = 30.0,
    urls: Sequence[str] = (DEFAULT_URL,),
    secret: bytes | None = None,
    timeout_s: float | None = None,
    wait_s: float = 5.0,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    on_position: Callable[[int], None] | None = None,
) -> AsyncIterator[LockFence]:
    """Hold the cluster lock `name` for the body; yields the grant's fence `[term, seq]`.

    Waits in FIFO order up to `timeout_s` (None: forever), asking again at least every
    `wait_s` (and every ttl_s / 3); `on_position(N)` hears each queue position answered.
    Raises LockLostError when the lease was lost while the body ran (the body is cancelled),
    LockUnavailableError when no node answers.

    The lease is counted from when the granting request was sent (the coordinator granted or
    renewed no earlier), so this side believes it holds the lock no longer than the coordinator
    does; the body is cancelled a margin before that belief ends unless a renewal got through.
    """
    holder = holder or default_holder()
    ask_s = min(wait_s, ttl_s / 3)
    async with LockClient(urls, secret=secret, request_timeout_s=request_timeout_s) as client:
        body = AcquireJson(holder=holder, ttl_s=ttl_s, wait=True, wait_s=ask_s)
        fence, sent_at = await _acquire(client, name, body, ttl_s, timeout_s, ask_s, on_position)
        body_task = asyncio.current_task()
        lost: list[str] = []
        leaving = asyncio.Event()
        renew = HolderJson(holder=holder, fence=fence.to_list())
        keep = _keep(client, name, renew, sent_at + ttl_s, ttl_s, leaving, lost, body_task)
        keeper = asyncio.create_task(keep, name=f"lock-{name}-renew")
        try:
            yield fence
        except asyncio.CancelledError:
            if lost and body_task is not None:
                body_task.uncancel()
                raise LockLostError(409, "lock_lost", f"lock {name!r} lost: {lost[0]}") from None
            raise
        finally:
            leaving.set()
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        if lost:
            raise LockLostError(409, "lock_lost", f"lock {name!r} lost: {lost[0]}")
        with contextlib.suppress(LockError):
            release = HolderJson(holder=holder, fence=fence.to_list())
            await client.call(name, "release", release, time.monotonic() + ttl_s)
