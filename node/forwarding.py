"""Calls a node forwards for an operator (to the coordinator, or to the node asked to leave)
carry the operator's proof: the original request's signature headers (a cluster signature, or
the proof the command made with its certificate's key: config.tls.proof) in X-Shoal-Proof, with
the original method, path, query and body. The node that acts checks the proof and acts, and
audits, as that operator; without one a forwarded call is the forwarding node's own."""

from __future__ import annotations

import base64
import binascii
import contextvars
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from config import (
    BOUND_HEADERS,
    HEADER_FORWARDED,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    AuthError,
    verify_request,
)

if TYPE_CHECKING:
    from config.tls import PeerIdentity

__all__ = [
    "PROOF_HEADER",
    "REQUEST_FORWARDER",
    "TLS_VERIFIER",
    "forward_headers",
    "proven_operator",
]

PROOF_HEADER = "X-Shoal-Proof"
"""base64 of the JSON object of the original request's signature headers."""
MAX_PROOF_CHARS = 16384
TLS_VERIFIER: web.RequestKey[Callable[[bytes], PeerIdentity]] = web.RequestKey("tls_verifier")
"""Set by node.identity on TLS requests: checks a certificate (DER) against the CA and CRL."""
REQUEST_FORWARDER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "shoal_request_forwarder", default=None
)
"""The node that forwarded the request being handled for a proven operator (audit)."""
_CARRIED = (*BOUND_HEADERS, HEADER_NONCE, "X-Shoal-Timestamp", HEADER_SIGNATURE)
_OPERATOR_PREFIX = "X-Shoal-Operator-"


def forward_headers(request: web.Request, node_id: str) -> dict[str, str]:
    """The headers of `request` forwarded by node `node_id`: X-Shoal-Forwarded and, when the
    request carries a signature or an operator's proof, X-Shoal-Proof with them. Forward the
    request's method, raw path and query and its body bytes unchanged, or the proof fails."""
    carried = {
        name: value
        for name, value in request.headers.items()
        if name.title() in {h.title() for h in _CARRIED}
        or name.title().startswith(_OPERATOR_PREFIX)
    }
    headers = {HEADER_FORWARDED: node_id}
    if HEADER_SIGNATURE.title() in {name.title() for name in carried} or any(
        name.title().startswith(_OPERATOR_PREFIX) for name in carried
    ):
        headers[PROOF_HEADER] = base64.b64encode(json.dumps(carried).encode()).decode()
    return headers


def _carried(request: web.Request) -> dict[str, str] | None:
    text = request.headers.get(PROOF_HEADER)
    if text is None:
        return None
    try:
        if len(text) > MAX_PROOF_CHARS:
            raise ValueError("too long")
        doc: Any = json.loads(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise AuthError(f"{PROOF_HEADER} is not base64 of a JSON object: {exc}") from exc
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise AuthError(f"{PROOF_HEADER} is not an object of header values")
    return {str(k).title(): v for k, v in doc.items()}


async def proven_operator(
    request: web.Request,
    *,
    secret: bytes | None,
    seen: Callable[[str], bool],
    skew_s: float,
    nonces: Any,
) -> PeerIdentity | str | None:
    """Who the forwarded `request` acts for: the operator whose proof it carries (its
    certificate's identity, or a cluster signer's id), None without a proof. AuthError when a
    proof is there and does not hold for this request (method, path, query, body, time)."""
    carried = _carried(request)
    if carried is None:
        return None
    body = await request.read()
    now = time.time()
    if any(name.startswith(_OPERATOR_PREFIX) for name in carried):
        verifier = request.get(TLS_VERIFIER)
        if verifier is None:
            raise AuthError("an operator's certificate proof is checked only by a TLS node")
        from config.tls.proof import verify_operator_proof

        return verify_operator_proof(
            carried, request.method, request.raw_path, body, verifier, seen=seen, now=now,
            skew_s=skew_s,
        )  # fmt: skip
    if secret is None:
        raise AuthError("a signed proof is checked only by a node with the cluster secret")
    sender = verify_request(secret, carried, request.method, request.raw_path, body, nonces, now)
    forwarder = request.headers.get(HEADER_FORWARDED, "")
    target = carried.get("X-Shoal-Target")
    if target is not None and target != forwarder:
        raise AuthError(f"the proof was signed for {target!r}, not for {forwarder!r}")
    return sender
