"""Election calls go through the peer's `election` breaker: failures open it, refusals do not,
and it stays open only for one election timeout so a healed peer is heard again quickly."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestServer

from config import Timeouts
from health import BreakerConfig, BreakerRegistry, CircuitState
from node.election.messages import VoteRequest
from node.election.routes import VOTE_PATH
from node.election.transport import HttpElectionTransport, election_breaker_config


async def test_election_calls_go_through_the_peers_breaker() -> None:
    mode = {"answer": "refuse"}
    calls: list[str] = []

    async def vote(request: web.Request) -> web.Response:
        calls.append(mode["answer"])
        if mode["answer"] == "refuse":
            return web.json_response({"error": "busy", "status": 503}, status=503)
        return web.Response(text="not json", content_type="application/json")

    app = web.Application()
    app.router.add_post(VOTE_PATH, vote)
    now = [100.0]
    registry = BreakerRegistry(BreakerConfig(failure_threshold=2), clock=lambda: now[0])
    timeouts = Timeouts(election_min_s=1.5, election_max_s=3.0)
    config = election_breaker_config(registry.config, timeouts)
    assert (config.failure_threshold, config.recovery_timeout_s, config.max_backoff_s) == (
        2,
        1.5,
        3.0,
    )
    async with TestServer(app, host="127.0.0.1") as server:
        port = server.port or 0
        async with HttpElectionTransport(
            "a",
            lambda _: ("127.0.0.1", port),
            secret=None,
            timeout_s=2.0,
            breakers=registry,
            breaker_config=config,
        ) as transport:
            for _ in range(4):  # the peer answered "no": not a failure of the peer
                assert await transport.request_vote("b", VoteRequest(1, "a")) is None
            breaker = registry.breaker_for("b", "election")
            assert breaker.state is CircuitState.CLOSED
            mode["answer"] = "garbage"
            for _ in range(2):
                assert await transport.request_vote("b", VoteRequest(1, "a")) is None
            assert breaker.state is CircuitState.OPEN
            assert await transport.request_vote("b", VoteRequest(1, "a")) is None
            assert len(calls) == 6  # the open breaker kept the third failing call home
            assert breaker.config.recovery_timeout_s == 1.5
            now[0] += 1.6  # one election timeout later a probe goes through
            assert await transport.request_vote("b", VoteRequest(1, "a")) is None
            assert len(calls) == 7
            assert breaker.state is CircuitState.OPEN  # the probe failed: open again
            snapshot = breaker.snapshot()
            assert snapshot.current_recovery_s == 3.0  # backoff capped at election_max_s
