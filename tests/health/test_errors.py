"""health's table: aiohttp and OS errors of the monitor's requests become FetchError rows."""

from __future__ import annotations

import errno

from health import FetchError, FetchTimeoutError, HealthError
from health.errors import fetch_error, http_fetch_error


def test_a_timeout_is_the_timeout_subclass() -> None:
    error = fetch_error(TimeoutError(), 3)
    assert type(error) is FetchTimeoutError
    assert isinstance(error, TimeoutError)
    assert error.reason == "timeout after 3.0 s"


def test_other_errors_are_fetch_errors_with_the_row_reason() -> None:
    error = fetch_error(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), 3)
    assert type(error) is FetchError
    assert isinstance(error, HealthError)
    assert error.reason.startswith("unreachable:")


def test_an_error_answer_shows_the_nodes_reason() -> None:
    body = b'{"error": "unauthorized", "reason": "bad signature", "status": 401}'
    assert http_fetch_error(401, body).reason == "401: bad signature"
    assert http_fetch_error(502, b"").reason == "502: HTTP 502"


def test_the_peer_clients_errors_read_as_the_rows_reason() -> None:
    from net import PeerRequestError, PeerTimeoutError

    timeout = fetch_error(PeerTimeoutError("http://n:1/v1/status", "no answer in 3 s"), 3)
    assert (type(timeout), timeout.reason) == (FetchTimeoutError, "timeout after 3.0 s")
    refused = PeerRequestError("http://n:1/v1/status", "unreachable: connection refused")
    assert fetch_error(refused, 3).reason == "unreachable: connection refused"
    answered = PeerRequestError("http://n:1/v1/status", "bad signature", 401, code="unauthorized")
    assert fetch_error(answered, 3).reason == "401: bad signature"
