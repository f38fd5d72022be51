"""BlockingPeerClient: PeerClient's twin for code without an event loop (training and generator
processes, a command's synchronous path): the same signing, timeouts, TLS seam, breaker hook and
errors, over urllib (no aiohttp session, no thread)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, cast

from multidict import CIMultiDict

from config.timeouts import Timeouts
from net.build import Identity, Params
from net.errors import map_peer_errors
from net.exchange import (
    FAILURE_STATUS,
    answer_failure,
    answer_json,
    call_request,
    seam_base_url,
    sign_again,
)
from net.transport import BlockingTransport, PeerRequest, PeerResponse, SslContextProvider

__all__ = ["BlockingBreakerHook", "BlockingPeerClient", "UrllibTransport"]

BlockingBreakerHook = Callable[[str], AbstractContextManager[Any]]
"""The breaker of a peer by key, as a plain context manager (see net.client.BreakerHook)."""


class _NamedContext:
    """An SSL context that checks the name the request gives (net.transport.PeerRequest.tls),
    not the URL's host: urllib wraps its socket with the URL's host as the server name."""

    def __init__(self, context: ssl.SSLContext, server_hostname: str) -> None:
        self._context = context
        self._server_hostname = server_hostname

    def wrap_socket(self, sock: socket.socket, **kwargs: Any) -> ssl.SSLSocket:
        kwargs["server_hostname"] = self._server_hostname
        return self._context.wrap_socket(sock, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class UrllibTransport:
    """Sends each request on its own connection with urllib (a blocking caller makes few)."""

    def __init__(self, ssl_context: SslContextProvider | None = None) -> None:
        self._ssl_context = ssl_context

    def send(self, request: PeerRequest) -> PeerResponse:
        if not request.base.startswith(("http://", "https://")):
            raise ValueError(f"{request.base}: not an http(s) URL")
        sent = urllib.request.Request(  # noqa: S310 (the scheme is checked above)
            request.url,
            data=request.body if request.body or request.method != "GET" else None,
            headers=dict(request.headers),
            method=request.method,
        )
        context = self._ssl_context() if self._ssl_context is not None else None
        if request.tls is not None:  # the request's own context, and the name its peer proves
            context = cast(ssl.SSLContext, _NamedContext(*request.tls))
        try:
            with urllib.request.urlopen(  # noqa: S310
                sent, timeout=request.timeout_s, context=context
            ) as answer:
                headers = CIMultiDict(answer.headers.items())
                return PeerResponse(answer.status, headers, answer.read())
        except urllib.error.HTTPError as exc:  # an error answer is an answer
            body = exc.read() if exc.fp is not None else b""
            headers = CIMultiDict(exc.headers.items() if exc.headers else ())
            return PeerResponse(exc.code, headers, body)

    def close(self) -> None:
        """Nothing to release: no connection outlives its request."""


class BlockingPeerClient:
    """Blocking requests to peers: the contract of net.client.PeerClient without `await`."""

    def __init__(
        self,
        identity: Identity | None = None,
        *,
        timeouts: Timeouts | None = None,
        breaker: BlockingBreakerHook | None = None,
        ssl_context: SslContextProvider | None = None,
        transport: BlockingTransport | None = None,
    ) -> None:
        self.identity = identity or Identity()
        self.timeouts = timeouts or Timeouts()
        self._breaker = breaker
        self._ssl_context = ssl_context
        self.transport: BlockingTransport = transport or UrllibTransport(ssl_context)

    def base_url(self, address: str) -> str:
        """As PeerClient.base_url: https while the TLS seam gives a context."""
        return seam_base_url(address, self._ssl_context)

    def request(
        self,
        method: str,
        peer: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        breaker_key: str | None = None,
        check: bool = True,
    ) -> PeerResponse:
        """As PeerClient.request."""
        request = call_request(
            self.identity, self.timeouts, method, self.base_url(peer), path, json=json,
            data=data, params=params, headers=headers, timeout_s=timeout_s, min_timeout_s=0.05,
        )  # fmt: skip
        guard = (
            contextlib.nullcontext()
            if self._breaker is None
            else self._breaker(breaker_key or request.base)
        )
        with guard:
            with map_peer_errors(request.url, request.timeout_s):
                answer = self.transport.send(request)
                if sign_again(self.identity, request, answer.status, answer.headers):
                    request = call_request(
                        self.identity, self.timeouts, method, self.base_url(peer), path,
                        json=json, data=data, params=params, headers=headers,
                        timeout_s=timeout_s, min_timeout_s=0.05,
                    )  # fmt: skip
                    answer = self.transport.send(request)
            failure = answer_failure(request, answer, check=check)
            if failure is not None and answer.status >= FAILURE_STATUS:
                raise failure  # the peer's fault: its breaker counts it
        if failure is not None:
            raise failure  # a refused request: the caller's
        return answer

    def call_json(
        self,
        method: str,
        peer: str,
        path: str,
        body: Any = None,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        breaker_key: str | None = None,
    ) -> tuple[int, Any]:
        """(status, JSON answer or None when empty) of `method` with `body` as JSON; errors as
        `request`, and PeerRequestError for an answer that is not JSON."""
        answer = self.request(
            method, peer, path, json=body, params=params, headers=headers,
            timeout_s=timeout_s, breaker_key=breaker_key,
        )  # fmt: skip
        return answer.status, answer_json(answer, self.base_url(peer) + path)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> BlockingPeerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
