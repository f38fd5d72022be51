"""Blocking HTTP calls of training and generator processes to daemons (signed when a secret is
set), with a timeout on every call; errors become PeerRequestError/PeerTimeoutError, and
RetryLater for a 429 or 503 that says when to come back."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from config import signed_headers
from node.errors import PeerRequestError, PeerTimeoutError, RetryLater
from node.rl.digest import SHA256_ALGO, Digest
from node.training.rendezvous import DaemonEndpoint
from sync import parse_retry_after


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
    """One request to `url` (default: the endpoint's daemon): (status, JSON body or None).
    Error answers (>= 400) raise PeerRequestError carrying the node's reason and status."""
    base = (url or endpoint.url).rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise PeerRequestError(base, "URL must start with http:// or https://")
    data = b"" if body is None else json.dumps(body).encode()
    sent = {"Accept": "application/json", **(headers or {})}
    if body is not None:
        sent["Content-Type"] = "application/json"
    if endpoint.secret is not None:
        sent.update(signed_headers(endpoint.secret, endpoint.node_id, method, path_qs, data))
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        base + path_qs, data=data if body is not None else None, headers=sent, method=method
    )
    wait_s = max(0.05, endpoint.timeout_s if timeout_s is None else timeout_s)
    where = base + path_qs
    try:
        with urllib.request.urlopen(request, timeout=wait_s) as response:  # noqa: S310
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        wait = parse_retry_after(exc.headers.get("Retry-After")) if exc.headers else None
        if wait is not None and exc.code in (429, 503):
            raise RetryLater(where, _reason(raw), exc.code, wait) from exc
        raise PeerRequestError(where, _reason(raw), exc.code) from exc
    except TimeoutError as exc:
        raise PeerTimeoutError(where, f"no answer in {wait_s:.1f} s") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise PeerTimeoutError(where, f"no answer in {wait_s:.1f} s") from exc
        raise PeerRequestError(where, f"unreachable: {exc.reason}") from exc
    except OSError as exc:
        raise PeerRequestError(where, f"unreachable: {exc}") from exc
    if not raw:
        return status, None
    try:
        return status, json.loads(raw)
    except ValueError as exc:
        raise PeerRequestError(where, f"not a JSON answer: {raw[:200]!r}", status) from exc


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


def _reason(raw: bytes) -> str:
    try:
        data = json.loads(raw)
    except ValueError:
        return raw[:200].decode(errors="replace") or "no reason given"
    if isinstance(data, Mapping):
        return str(data.get("reason") or data.get("error") or data)
    return str(data)
