"""net: the one peer client. Sessions per peer, request signing, the timeout table, a breaker
hook, a TLS seam, and one mapping of failures to PeerRequestError / PeerTimeoutError / RetryLater.

May import config only; wal, health, sync and node import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from net.aio import AiohttpTransport
    from net.blocking import BlockingBreakerHook, BlockingPeerClient, UrllibTransport
    from net.build import Identity, base_url, build_request, local_url, peer_url, split_url
    from net.client import BreakerHook, PeerClient
    from net.errors import (
        ClientClosedError,
        NetError,
        PeerRequestError,
        PeerTimeoutError,
        RetryLater,
        answer_error,
        map_peer_errors,
        parse_retry_after,
        peer_error,
    )
    from net.mock import MockHandler, MockTransport
    from net.threaded import BufferedStream, ThreadedTransport
    from net.transport import (
        AsyncTransport,
        BlockingTransport,
        PeerRequest,
        PeerResponse,
        PeerStream,
        PeerTls,
        SslContextProvider,
    )
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
