"""Sends one elector's messages: one task per request, at most one heartbeat in flight per peer,
replies handed back to the elector, and a peer's repeated silence logged once at WARNING."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from node.election.messages import Heartbeat, Message, Outbound, VoteRequest
from node.election.seams import ElectionTransport

log = logging.getLogger(__name__)

WARN_AFTER_FAILURES = 3
"""A peer's failures in a row after which its silence is logged at WARNING (once)."""


class Sender:
    """Owns the send tasks of one elector; `close()` cancels those in flight. Each reply is
    passed to `on_reply`; `term()` names the elector's term in log lines."""

    def __init__(
        self,
        node_id: str,
        transport: ElectionTransport,
        request_timeout_s: float,
        on_reply: Callable[[Message], Awaitable[None]],
        term: Callable[[], object],
    ) -> None:
        self._node_id = node_id
        self._transport = transport
        self._request_timeout_s = request_timeout_s
        self._on_reply = on_reply
        self._term = term
        self._sends: set[asyncio.Task[None]] = set()
        self._heartbeats_in_flight: set[str] = set()
        self._failing: dict[str, int] = {}
        self._closed = False

    def send_all(self, outbound: Sequence[Outbound]) -> None:
        """Start sending each message; a heartbeat to a peer that has one in flight is skipped."""
        if self._closed:
            return
        for item in outbound:
            if isinstance(item.message, Heartbeat):
                if item.to in self._heartbeats_in_flight:
                    continue
                self._heartbeats_in_flight.add(item.to)
            task = asyncio.create_task(self._send(item), name=f"election-send-{item.to}")
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def close(self) -> None:
        """Cancel every send in flight. Idempotent."""
        self._closed = True
        tasks = list(self._sends)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sends.clear()

    async def _send(self, item: Outbound) -> None:
        reply: Message | None = None
        try:
            async with asyncio.timeout(self._request_timeout_s):
                if isinstance(item.message, VoteRequest):
                    reply = await self._transport.request_vote(item.to, item.message)
                elif isinstance(item.message, Heartbeat):
                    reply = await self._transport.send_heartbeat(item.to, item.message)
        except Exception as exc:  # timeouts and transport errors mean "no answer"
            self._peer_failed(item.to, repr(exc))
            return
        finally:
            if isinstance(item.message, Heartbeat):
                self._heartbeats_in_flight.discard(item.to)
        if reply is None:
            self._peer_failed(item.to, "no answer")
            return
        self._peer_answered(item.to)
        await self._on_reply(reply)

    def _peer_failed(self, peer: str, why: str) -> None:
        """A peer's third failure in a row logs at WARNING (once), the others at DEBUG."""
        failures = self._failing.get(peer, 0) + 1
        self._failing[peer] = failures
        log.log(
            logging.WARNING if failures == WARN_AFTER_FAILURES else logging.DEBUG,
            "node %s term %s: no election answer from %s (%d in a row): %s",
            self._node_id,
            self._term(),
            peer,
            failures,
            why,
        )

    def _peer_answered(self, peer: str) -> None:
        if self._failing.pop(peer, 0) >= WARN_AFTER_FAILURES:
            log.info(
                "node %s term %s: %s answers election messages again",
                self._node_id,
                self._term(),
                peer,
            )
