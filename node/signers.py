"""Which signatures a node serves: the node a request is signed for must be this one, and a
signature of the previous release (bound to no node) is served only from this host or from a
member of the previous release (docs/signing.md says why)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from config import HEADER_TARGET, protocol_of
from node.errors import TargetError

__all__ = [
    "UNBOUND_SIGNER_PROTOCOL",
    "TargetError",
    "check_target",
    "local_or_previous",
    "node_bound",
    "unbound_check",
]

MAX_TARGET_CHARS_SHOWN = 80


UNBOUND_SIGNER_PROTOCOL = 1
"""Members announcing this protocol or none (config.version.protocol_of) are of the release
before signatures named their target node: their requests are served signed as it signs."""


def local_or_previous(
    sender: str, remote: str | None, own_address: str | None, membership: object
) -> bool:
    """Whether a request without a target in its signature is served: it comes from this host
    (loopback or `own_address`: its processes started under the previous release keep
    running), or its sender names a member of `membership` of the previous release (during a
    rolling upgrade; the v1 signature does not cover the sender, so this holds only while such
    a member is in the view)."""
    host = (remote or "").split("%", 1)[0]
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    if own_address is not None and host == own_address:
        return True
    members = getattr(membership, "members", None)
    if members is None:
        return False
    return any(
        member.node_id == sender and protocol_of(member.meta) <= UNBOUND_SIGNER_PROTOCOL
        for member in members()
    )


class NodeBound(TypedDict):
    """The AuthPolicy fields node_bound gives."""

    node_id: str
    unbound_ok: Callable[[str, str | None], bool]


def node_bound(runtime: Any) -> NodeBound:
    """The AuthPolicy fields that bind requests to a node's `runtime`: its node id (the target
    a request must be signed for) and `unbound_ok` (unbound_check)."""
    return NodeBound(node_id=runtime.node_id, unbound_ok=unbound_check(runtime))


def unbound_check(runtime: Any) -> Callable[[str, str | None], bool]:
    """AuthPolicy.unbound_ok of a node's `runtime` (node.runtime.NodeRuntime):
    local_or_previous with its address and membership view at the time of each request."""
    return lambda sender, remote: local_or_previous(
        sender, remote, runtime.address, runtime.membership
    )


def check_target(
    node_id: str | None,
    unbound_ok: Callable[[str, str | None], bool] | None,
    headers: Mapping[str, str],
    node: str,
    remote: str | None,
) -> None:
    """TargetError unless the request of these `headers` from sender `node` at `remote` is
    signed for `node_id` (None: any), or is of the previous release where `unbound_ok` serves
    it (None: everywhere)."""
    target = headers.get(HEADER_TARGET)
    if target is None:
        if unbound_ok is not None and not unbound_ok(node, remote):
            raise TargetError(
                f"a signature without {HEADER_TARGET} (the previous release's, which covers no "
                "target node) is served only from this host or from a member of the previous "
                f"release; this is node {node_id}: upgrade the client"
            )
    elif node_id is not None and target != node_id:
        shown = target[:MAX_TARGET_CHARS_SHOWN]
        raise TargetError(
            f"signed for node {shown!r}, this is node {node_id!r}"
            if shown
            else f"signed for no node; this is node {node_id!r}: sign for it"
        )
