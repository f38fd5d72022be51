"""Telling the rest of the daemon about the view: listeners, and logs that say each peer failure
once at WARNING (then at DEBUG for a while) and each node id conflict once at ERROR."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable

from node.membership.types import Address, EventKind, MemberEvent, MemberState, MemberView

log = logging.getLogger("node.membership.service")

Listener = Callable[[MemberEvent], None]
"""Called on the event loop, synchronously, with every change of the view."""

WARN_AGAIN_S = 600.0
"""A peer that fails again within this time is logged at DEBUG."""


class EventHub:
    """The listeners of one membership and what it has already warned about."""

    def __init__(self, self_id: str, clock: Callable[[], float]) -> None:
        self._self_id = self_id
        self._clock = clock
        self._listeners: list[Listener] = []
        self._warned_at: dict[str, float] = {}
        self._conflicts: set[tuple[str, Address]] = set()
        self.counts: Counter[EventKind] = Counter()
        """Events emitted since start, by kind (a `dead` of a member that comes back alive was
        a false death, or a crash and restart)."""

    def add(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def in_conflict(self, node_id: str, other: Address) -> bool:
        return (node_id, other) in self._conflicts

    def emit(
        self,
        kind: EventKind,
        member: MemberView,
        previous: MemberState | None,
        conflict_with: Address | None = None,
    ) -> None:
        """Log the event and call every listener; a failing listener is logged, not raised."""
        self._log(kind, member, conflict_with)
        self.counts[kind] += 1
        event = MemberEvent(kind, member, previous, conflict_with)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("%s: membership listener failed on %s", self._self_id, kind)

    def conflict(self, member: MemberView, other: Address) -> bool:
        """Report that `member`'s id is also claimed at `other`; False if already reported."""
        key = (member.node_id, other)
        if key in self._conflicts:
            return False
        self._conflicts.add(key)
        self.emit(EventKind.CONFLICT, member, member.state, other)
        return True

    def forget(self, node_id: str) -> None:
        for kind in (EventKind.SUSPECT, EventKind.DEAD):
            self._warned_at.pop(f"{kind}:{node_id}", None)

    def _log(self, kind: EventKind, member: MemberView, other: Address | None) -> None:
        me, node_id = self._self_id, member.node_id
        if kind == EventKind.CONFLICT and other is not None:
            log.error(
                "%s: node id %s is claimed by two live nodes, %s:%s and %s:%s; give every host "
                "its own node id",
                me,
                node_id,
                member.address,
                member.port,
                other[0],
                other[1],
            )
        elif kind in (EventKind.SUSPECT, EventKind.DEAD):
            now = self._clock()
            key = f"{kind}:{node_id}"
            repeated = now - self._warned_at.get(key, -math.inf) < WARN_AGAIN_S
            if not repeated:
                self._warned_at[key] = now
            level = logging.INFO if kind == EventKind.SUSPECT else logging.WARNING
            log.log(
                logging.DEBUG if repeated else level,
                "%s: member %s (%s:%s) is %s",
                me,
                node_id,
                member.address,
                member.port,
                kind,
            )
        elif kind in (EventKind.JOINED, EventKind.ALIVE, EventKind.LEFT):
            log.info(
                "%s: member %s (%s:%s) %s, incarnation %d",
                me,
                node_id,
                member.address,
                member.port,
                kind,
                member.incarnation,
            )
        else:
            log.debug("%s: member %s %s", me, node_id, kind)
