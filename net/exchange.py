"""What both peer clients (PeerClient and its blocking twin) share apart from their I/O: the
signed request of a call within its timeout, and what a peer's answer means (its clock skew, the
error it maps to, whether the peer's breaker counts it, its JSON)."""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
import time
from collections.abc import Mapping
from typing import Any

from config.auth import CLOCK_SKEWS, HEADER_CLOCK_SKEW, HEADER_SIGNATURE, HEADER_TARGET
from config.timeouts import Timeouts
from net.build import Identity, Params, base_url, build_request
from net.errors import PeerRequestError, answer_error, map_peer_errors
from net.transport import PeerRequest, PeerResponse, SslContextProvider

__all__ = [
    "FAILURE_STATUS",
    "answer_failure",
    "answer_json",
    "call_request",
    "note_clock_skew",
    "seam_base_url",
    "sign_again",
]

FAILURE_STATUS = 500
"""Error answers from this status up count against the peer's breaker; lower ones (a refused
request) are the caller's, not the peer's fault."""


def note_clock_skew(request: PeerRequest, status: int, headers: Mapping[str, str]) -> None:
    """Record (or clear) a peer's clock skew learnt from its answer to a signed request."""
    if HEADER_SIGNATURE not in request.headers:
        return
    skew = headers.get(HEADER_CLOCK_SKEW)
    if status == 401 and skew is not None:
        with contextlib.suppress(ValueError):  # the sender's (our) clock minus the peer's
            CLOCK_SKEWS.record(request.base.split("://", 1)[-1], -float(skew), time.time())
    elif status != 401:
        CLOCK_SKEWS.clear(request.base.split("://", 1)[-1])


def sign_again(
    identity: Identity, request: PeerRequest, status: int, headers: Mapping[str, str]
) -> bool:
    """Whether the peer's answer to a signed `request` asks for it to be signed again (for
    the node it named, or as the previous release signs: config.auth.SigningTargets)."""
    if identity.secret is None or HEADER_SIGNATURE not in request.headers:
        return False
    signed_for = request.headers.get(HEADER_TARGET)
    return identity.targets.learn(request.base, signed_for, status, headers)


def seam_base_url(address: str, ssl_context: SslContextProvider | None) -> str:
    """The base URL of the peer at `address`: https while the TLS seam `ssl_context` gives a
    context (or the address says https), else http."""
    tls = ssl_context is not None and ssl_context() is not None
    return base_url(address, tls=tls)


def call_request(
    identity: Identity,
    timeouts: Timeouts,
    method: str,
    base: str,
    path: str,
    *,
    json: Any,
    data: bytes | None,
    params: Params,
    headers: Mapping[str, str] | None,
    timeout_s: float | None,
    min_timeout_s: float | None = None,
    tls: tuple[ssl.SSLContext, str] | None = None,
) -> PeerRequest:
    """The signed request of a call to the peer at `base`, within `timeout_s` (None: the table's
    `http_request_s`), raised to `min_timeout_s` when given (a transport that cannot wait 0 s),
    with the peer's handshake `tls` when given (PeerRequest.tls)."""
    wait_s = timeouts.http_request_s if timeout_s is None else timeout_s
    if min_timeout_s is not None:
        wait_s = max(min_timeout_s, wait_s)
    request = build_request(
        identity, method, base, path, json=json, data=data, params=params, headers=headers,
        timeout_s=wait_s,
    )  # fmt: skip
    if identity.prover is not None and request.method not in ("GET", "HEAD"):
        name = tls[1] if tls is not None else base.split("://", 1)[-1].rsplit(":", 1)[0]
        proof = identity.prover(request.method, request.path_qs, request.body, name)
        request = dataclasses.replace(request, headers={**request.headers, **proof})
    return request if tls is None else dataclasses.replace(request, tls=tls)


def answer_failure(
    request: PeerRequest, answer: PeerResponse, *, check: bool
) -> PeerRequestError | None:
    """What the peer's `answer` to `request` means: its clock skew is noted (for a signed
    request), and with `check` an error answer (>= 400) gives the error it maps to
    (answer_error's: RetryLater for a 429/503 with Retry-After); else None. The caller raises
    it inside the peer's breaker when the status is FAILURE_STATUS or more, outside it below."""
    note_clock_skew(request, answer.status, answer.headers)
    if check and answer.status >= 400:
        return answer_error(request.url, answer.status, answer.body, answer.headers)
    return None


def answer_json(answer: PeerResponse, url: str) -> Any:
    """The JSON of `answer` (None for an empty body) from `url`; PeerRequestError when it is
    not JSON."""
    with map_peer_errors(url):
        return answer.json()
