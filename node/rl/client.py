"""Blocking HTTP calls of training and generator processes to daemons, through net's
BlockingPeerClient (signed when a secret is set, a timeout on every call); errors are net's
PeerRequestError/PeerTimeoutError, and RetryLater for a 429 or 503 that says when to come back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from net import BlockingPeerClient, Identity, PeerRequestError
from node.rl.digest import SHA256_ALGO, Digest
from node.training.rendezvous import DaemonEndpoint


def call(
    endpoint: DaemonEndpoint,
    method: str,
    path_qs: str,
    body: Mapping[str, Any] | None = None,
    *,
    url: str | None = None,
    timeout_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, Any]:
    """One request to `url` (default: the endpoint's daemon) through net's blocking client:
    (status, JSON body or None). Error answers (>= 400) raise PeerRequestError carrying the
    node's reason and status (RetryLater for a 429/503 with Retry-After)."""
    base = (url or endpoint.url).rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise PeerRequestError(base, "URL must start with http:// or https://")
    wait_s = max(0.05, endpoint.timeout_s if timeout_s is None else timeout_s)
    client = BlockingPeerClient(Identity(endpoint.secret, endpoint.node_id))
    return client.call_json(method, base, path_qs, body, headers=headers, timeout_s=wait_s)


def post_digested(
    endpoint: DaemonEndpoint,
    path_qs: str,
    body: Mapping[str, Any],
    digest: Digest,
    *,
    url: str | None = None,
    timeout_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, Any]:
    """POST `body` with `digest`'s fields (Digest.fields). A daemon of the previous release
    refuses the unknown `digest` field (400, reason "digest: ..."); for a sha256 digest the
    body then goes once more with the previous release's `sha256` alone, which it reads."""
    try:
        return call(
            endpoint, "POST", path_qs, {**body, **digest.fields()},
            url=url, timeout_s=timeout_s, headers=headers,
        )  # fmt: skip
    except PeerRequestError as exc:
        older = exc.status == 400 and exc.reason.startswith("digest:")
        if not older or digest.algo != SHA256_ALGO:
            raise
    return call(
        endpoint, "POST", path_qs, {**body, "sha256": digest.value},
        url=url, timeout_s=timeout_s, headers=headers,
    )  # fmt: skip
