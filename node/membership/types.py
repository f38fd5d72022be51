"""Plain data of the membership protocol: member states, records, gossip updates, events, tuning.

Everything here is a frozen value; the decisions that use them live in `node.membership.rules`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from node.errors import MembershipError

MetaValue = str | int | float | bool | None
"""One value a node advertises about itself (version, role, gpu_count, ...)."""

Meta = Mapping[str, MetaValue]
Address = tuple[str, int]
"""(address, port) of a member: the HTTP API port, which is also its membership UDP port."""

MAX_META_KEYS = 32
MAX_META_KEY_CHARS = 64
MAX_META_TEXT_CHARS = 256
MAX_NODE_ID_CHARS = 128
EMPTY_META: Meta = MappingProxyType({})


class MemberState(enum.StrEnum):
    """Where a member stands in this node's view."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


class EventKind(enum.StrEnum):
    """What happened to a member, as listeners are told."""

    JOINED = "joined"
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"
    UPDATED = "updated"
    CONFLICT = "conflict"
    REAPED = "reaped"


@dataclass(frozen=True, slots=True)
class Member:
    """One member as this node knows it. `state_since` is local monotonic time."""

    node_id: str
    address: str
    port: int
    state: MemberState
    incarnation: int
    meta: Meta = field(default_factory=lambda: EMPTY_META)
    state_since: float = 0.0
    conflict: Address | None = None
    previous_address: Address | None = None

    @property
    def endpoint(self) -> Address:
        return (self.address, self.port)


@dataclass(frozen=True, slots=True)
class Update:
    """A gossiped fact about one member; also one record of a push-pull full-state exchange.

    `address`, `port` and `meta` travel with alive updates and full-state records; `by` names the
    member that suspects or declared dead (Lifeguard counts distinct suspecters).
    """

    node_id: str
    state: MemberState
    incarnation: int
    address: str | None = None
    port: int | None = None
    meta: Meta | None = None
    by: str | None = None

    @property
    def endpoint(self) -> Address | None:
        if self.address is None or self.port is None:
            return None
        return (self.address, self.port)


@dataclass(frozen=True, slots=True)
class MemberView:
    """One row of the view the daemon shows: `last_seen_s` is seconds since last heard from."""

    node_id: str
    address: str
    port: int
    state: MemberState
    incarnation: int
    last_seen_s: float
    meta: Meta
    is_self: bool = False
    conflict: Address | None = None
    refused: str | None = None
    """Why this node refuses the member (its certificate was revoked), else None."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A member this node will not hear: `reason` for the view and the log; `mark` is the
    (meta key, value) it advertised when refused. Its datagrams are dropped and news of it
    alive ignored until it advertises another value for that key (a new certificate)."""

    reason: str
    mark: tuple[str, str] | None = None

    def lifted_by(self, update: Update) -> bool:
        """True when `update` (about the refused member) advertises another mark value."""
        if self.mark is None or update.meta is None:
            return False
        value = update.meta.get(self.mark[0])
        return value is not None and str(value) != self.mark[1]


@dataclass(frozen=True, slots=True)
class MemberEvent:
    """A change of the view. `conflict_with` is set for CONFLICT: the other claimant's address."""

    kind: EventKind
    member: MemberView
    previous: MemberState | None = None
    conflict_with: Address | None = None


@dataclass(frozen=True, slots=True)
class SwimTuning:
    """Protocol constants that are not timeouts (those come from `config.Timeouts`).

    retransmit_mult: each update is sent about retransmit_mult * ceil(log10(N + 1)) times.
    suspicion_max_mult: an unconfirmed suspicion lasts this many times the minimum.
    gossip_interval_mult: eager gossip runs every probe_interval * this while updates are queued.
    sync_every_probes: push-pull full-state sync period, in probe intervals (scaled up past 32).
    """

    k_indirect: int = 3
    gossip_fanout: int = 3
    gossip_interval_mult: float = 0.4
    retransmit_mult: int = 4
    max_piggyback: int = 16
    suspicion_max_mult: float = 3.0
    max_health_score: int = 8
    sync_every_probes: int = 10
    leave_fanout: int = 5
    candidate_attempts: int = 3
    candidates_per_tick: int = 16
    stall_threshold_min_s: float = 0.05
    nack_fraction: float = 0.8
    conflict_refute_every_probes: int = 10

    def __post_init__(self) -> None:
        if self.k_indirect < 0 or self.gossip_fanout < 0 or self.max_piggyback < 1:
            raise MembershipError("k_indirect and gossip_fanout must be >= 0, max_piggyback >= 1")
        if self.suspicion_max_mult < 1.0 or self.retransmit_mult < 1:
            raise MembershipError("suspicion_max_mult and retransmit_mult must be >= 1")


def validate_node_id(node_id: str) -> str:
    """`node_id` if usable on the wire, else MembershipError."""
    if not node_id or len(node_id) > MAX_NODE_ID_CHARS or not node_id.isprintable():
        raise MembershipError(
            f"node id {node_id!r} must be 1 to {MAX_NODE_ID_CHARS} printable chars"
        )
    return node_id


def validate_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise MembershipError(f"port {port!r} must be an integer in 1..65535")
    return port


def freeze_meta(meta: Mapping[str, object]) -> Meta:
    """A read-only copy of `meta` after checking it is small and of scalar values."""
    if len(meta) > MAX_META_KEYS:
        raise MembershipError(f"meta has {len(meta)} keys; at most {MAX_META_KEYS} are gossiped")
    # Every state record and alive update carries meta: the plain types a JSON body decodes to
    # are checked inline and copied in one call; anything else by _checked_meta, which names it.
    for key, value in meta.items():
        kind = type(value)
        if (
            type(key) is not str
            or not 0 < len(key) <= MAX_META_KEY_CHARS
            or not (
                (kind is str and len(value) <= MAX_META_TEXT_CHARS)  # type: ignore[arg-type]
                or kind is int
                or value is None
                or kind is bool
                or (kind is float and math.isfinite(value))  # type: ignore[arg-type]
            )
        ):
            return _checked_meta(meta)
    return MappingProxyType(dict(meta))  # type: ignore[arg-type]  # its values checked above


def _checked_meta(meta: Mapping[str, object]) -> Meta:
    checked: dict[str, MetaValue] = {}
    for key, value in meta.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_META_KEY_CHARS:
            raise MembershipError(f"meta key {key!r} must be a string of 1..{MAX_META_KEY_CHARS}")
        checked[key] = _meta_value(key, value)
    return MappingProxyType(checked)


def _meta_value(key: str, value: object) -> MetaValue:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        if len(value) > MAX_META_TEXT_CHARS:
            raise MembershipError(f"meta {key!r} is longer than {MAX_META_TEXT_CHARS} chars")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MembershipError(f"meta {key!r} must be a finite number")
        return value
    raise MembershipError(f"meta {key!r} must be str, int, float, bool or None")
