"""Revoked peers leave the membership view. A revoked node is refused on every HTTP call, but it
still holds the gossip key; so each node keeps the certificate serial of every node identity
(what the member advertises in its meta, `cert_serial`, and what its calls to this node present
in their handshakes, whichever this node saw last) and refuses in SWIM every member whose serial
is on the CRL in use: its datagrams are dropped, it shows dead with `refused` in the view, and
news of it alive is ignored. An advertised serial may add a refusal, never lift one (it is a
claim: a thief of the gossip key can advertise any serial); only a verified handshake of the
node with a certificate that is not revoked, made after the refusal, lifts it.
`RevokedPeers.apply` runs with the TLS files' watch (each second) and so follows every new CRL.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from config.tls import serial_text
from config.tls.context import TlsContexts
from node.errors import NodeError

__all__ = ["CERT_META", "REVOKED", "RefusingMembership", "RevokedPeers"]

log = logging.getLogger(__name__)

CERT_META = "cert_serial"
"""The member meta key holding the serial of the node's certificate (uppercase hex)."""
REVOKED = "revoked"


@runtime_checkable
class RefusingMembership(Protocol):
    """What RevokedPeers needs of the membership (node.membership.Membership)."""

    def members(self) -> Sequence[Any]: ...
    def refuse(self, node_id: str, reason: str, mark: tuple[str, str] | None = None) -> None: ...
    def allow(self, node_id: str) -> None: ...
    def update_meta(self, changes: Mapping[str, Any]) -> None: ...


def _parse_serial(value: object) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return int(value, 16)
    except ValueError:
        return None


class RevokedPeers:
    """The serial of each node identity as this node last saw it, and the members it refuses
    because that serial is revoked (a class: it keeps what it saw between CRLs)."""

    def __init__(self, contexts: TlsContexts, self_id: str) -> None:
        self._contexts = contexts
        self._self_id = self_id
        self._serials: dict[str, int] = {}
        self._advertised: dict[str, int] = {}
        self._proven: dict[str, int] = {}
        """The serial of each node's latest verified handshake since it was last refused."""
        self._refused: dict[str, str] = {}

    def saw(self, name: str, serial: int, *, verified: bool) -> None:
        """A call of node `name` presented the certificate with `serial`: `verified` (chained
        to the CA, valid now, not revoked) or refused."""
        if name == self._self_id:
            return
        self._serials[name] = serial
        if verified:
            self._proven[name] = serial

    def _learn_meta(self, members: Sequence[Any]) -> None:
        """A member advertising a serial it did not advertise before: that is its latest."""
        for member in members:
            node_id = member.node_id
            if node_id == self._self_id or getattr(member, "is_self", False):
                continue
            serial = _parse_serial(member.meta.get(CERT_META))
            if serial is not None and self._advertised.get(node_id) != serial:
                self._advertised[node_id] = serial
                self._serials[node_id] = serial

    def verdicts(self, members: Sequence[Any]) -> dict[str, str]:
        """The node ids to refuse, each with the sentence that says why: a member whose latest
        serial is revoked, and one refused before that has not since presented, in a verified
        handshake, a certificate that is not revoked (whatever serial it advertises now)."""
        self._learn_meta(members)
        known = {member.node_id for member in members} | set(self._refused)
        material = self._contexts.material
        found: dict[str, str] = {}
        for node_id, serial in self._serials.items():
            if node_id not in known:
                continue  # an operator's or reader's certificate, or a node not met yet
            when = material.revoked_at(serial)
            if when is not None:
                found[node_id] = (
                    f"{REVOKED}: the certificate of {node_id!r} (serial {serial_text(serial)}) "
                    f"was revoked at {when.isoformat()} (CRL number {material.crl_number})"
                )
            elif node_id in self._refused and not self._proven_good(node_id):
                found[node_id] = self._refused[node_id]  # a claim lifts nothing
        for node_id in set(found) - set(self._refused):
            self._proven.pop(node_id, None)  # a proof must come after the refusal
        return found

    def _proven_good(self, node_id: str) -> bool:
        serial = self._proven.get(node_id)
        return serial is not None and self._contexts.material.revoked_at(serial) is None

    def apply(self, membership: object) -> dict[str, str]:
        """Refuse in `membership` every member whose certificate is revoked, let back those
        that are no longer, and advertise this node's own serial; the refusals now."""
        if not isinstance(membership, RefusingMembership):
            return {}
        own = serial_text(self._contexts.material.own.serial)
        members = membership.members()
        me = next((m for m in members if getattr(m, "is_self", False)), None)
        if me is not None and me.meta.get(CERT_META) != own:
            try:
                membership.update_meta({CERT_META: own})
            except NodeError as exc:  # (meta too large to gossip): peers go by the handshakes
                log.warning("cannot advertise certificate serial %s: %s", own, exc)
        verdicts = self.verdicts(members)
        for node_id, reason in verdicts.items():  # (the membership logs each new refusal)
            membership.refuse(node_id, reason)  # no mark: what it advertises lifts nothing
        for node_id in set(self._refused) - set(verdicts):
            log.warning(
                "%s is no longer refused: it presented a certificate that is not revoked", node_id
            )
            membership.allow(node_id)
        self._refused = verdicts
        return dict(verdicts)
