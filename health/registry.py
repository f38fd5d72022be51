"""Breakers by peer and transport, one registry per node, and the "own network" alarm.

The module-level functions use a default registry; tests running several nodes give each its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from health.breaker import CircuitBreaker
from health.breaker_config import (
    BreakerConfig,
    BreakerSnapshot,
    CircuitState,
    Clock,
    StateListener,
)

__all__ = [
    "BreakerRegistry",
    "TransitionListener",
    "all_breakers",
    "breaker_for",
    "configure_breakers",
    "default_registry",
    "format_breakers",
    "reset_all_breakers",
]

logger = logging.getLogger(__name__)

TransitionListener = Callable[[CircuitBreaker, CircuitState, CircuitState], None]

MIN_PEERS_FOR_ALARM = 2


class BreakerRegistry:
    """Owns the breakers of one node: one per (peer, transport), created on first use.

    When more than half of the peers (at least two) have a breaker that is not CLOSED, logs once
    at ERROR that the fault is probably this node's own network, and again only after recovery.
    """

    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        clock: Clock = time.monotonic,
        node_id: str = "",
    ) -> None:
        self._config = config if config is not None else BreakerConfig()
        self._clock = clock
        self._node_id = node_id or "-"
        self._breakers: dict[tuple[str, str], CircuitBreaker] = {}
        self._states: dict[tuple[str, str], CircuitState] = {}
        self._listeners: list[TransitionListener] = []
        self._alarmed = False

    @property
    def config(self) -> BreakerConfig:
        return self._config

    @property
    def own_network_suspected(self) -> bool:
        """True while more than half of the peers (at least two) have an open breaker."""
        return self._alarmed

    def breaker_for(self, peer: str, transport: str = "http") -> CircuitBreaker:
        """The breaker of `peer` over `transport`; the same object on every call."""
        key = (peer, transport)
        breaker = self._breakers.get(key)
        if breaker is None:
            breaker = CircuitBreaker(
                f"{peer}/{transport}",
                self._config,
                clock=self._clock,
                peer=peer,
                transport=transport,
            )
            breaker.add_listener(self._listener_for(breaker))
            self._breakers[key] = breaker
            self._states[key] = CircuitState.CLOSED
        return breaker

    def breakers(self) -> list[CircuitBreaker]:
        """Every breaker, ordered by peer then transport."""
        return [self._breakers[key] for key in sorted(self._breakers)]

    def all_breakers(self) -> list[BreakerSnapshot]:
        """A snapshot of every breaker, ordered by peer then transport."""
        return [breaker.snapshot() for breaker in self.breakers()]

    def reset_all_breakers(self) -> None:
        """Close every breaker and forget its backoff."""
        for breaker in self.breakers():
            breaker.reset()

    def configure_breakers(self, config: BreakerConfig) -> None:
        """Use `config` for breakers created from now on and for the existing ones."""
        self._config = config
        for breaker in self._breakers.values():
            breaker.reconfigure(config)

    def forget(self, peer: str) -> None:
        """Drop every breaker of `peer` (it left the cluster); they no longer count as open."""
        for key in [key for key in self._breakers if key[0] == peer]:
            del self._breakers[key]
            del self._states[key]
        self._check_own_network()

    def add_listener(self, listener: TransitionListener) -> None:
        """Call `listener(breaker, old, new)` on every transition of every breaker, present or
        future; it receives the breaker so it can read `peer` and `transport`."""
        self._listeners.append(listener)

    def remove_listener(self, listener: TransitionListener) -> None:
        self._listeners.remove(listener)

    def _listener_for(self, breaker: CircuitBreaker) -> StateListener:
        def on_transition(_name: str, old: CircuitState, new: CircuitState) -> None:
            self._on_transition(breaker, old, new)

        return on_transition

    def _on_transition(self, breaker: CircuitBreaker, old: CircuitState, new: CircuitState) -> None:
        key = (breaker.peer, breaker.transport)
        if self._breakers.get(key) is not breaker:
            return  # forgotten while a call was in flight
        self._states[key] = new
        for listener in list(self._listeners):
            try:
                listener(breaker, old, new)
            except Exception:
                logger.warning(
                    "breaker registry listener %r failed on %s",
                    listener,
                    breaker.name,
                    exc_info=True,
                )
        self._check_own_network()

    def _check_own_network(self) -> None:
        peers = {peer for peer, _ in self._states}
        down = {
            peer for (peer, _), state in self._states.items() if state is not CircuitState.CLOSED
        }
        suspected = len(peers) >= MIN_PEERS_FOR_ALARM and len(down) * 2 > len(peers)
        if suspected and not self._alarmed:
            self._alarmed = True
            logger.error(
                "node %s: circuits to %d of %d peers are open (%s); the fault is probably this "
                "node's own network, not the peers",
                self._node_id,
                len(down),
                len(peers),
                ", ".join(sorted(down)),
            )
        elif not suspected and self._alarmed:
            self._alarmed = False
            logger.info(
                "node %s: circuits to %d of %d peers are open; own network looks healthy again",
                self._node_id,
                len(down),
                len(peers),
            )


_default_registry = BreakerRegistry()


def default_registry() -> BreakerRegistry:
    """The process-wide registry behind the module-level functions."""
    return _default_registry


def breaker_for(peer: str, transport: str = "http") -> CircuitBreaker:
    """The default registry's breaker of `peer` over `transport`."""
    return _default_registry.breaker_for(peer, transport)


def all_breakers() -> list[BreakerSnapshot]:
    """Snapshots of every breaker of the default registry."""
    return _default_registry.all_breakers()


def reset_all_breakers() -> None:
    """Close every breaker of the default registry."""
    _default_registry.reset_all_breakers()


def configure_breakers(default: BreakerConfig) -> None:
    """Set the config of the default registry's breakers, existing and future."""
    _default_registry.configure_breakers(default)


def format_breakers(snapshots: Iterable[BreakerSnapshot]) -> str:
    """One line per breaker that is not closed, or a line saying all are closed."""
    rows = list(snapshots)
    lines = []
    for snap in rows:
        if snap.state is CircuitState.CLOSED:
            continue
        retry = "" if snap.retry_after_s is None else f", retry in {snap.retry_after_s:.0f} s"
        lines.append(
            f"  {snap.peer} over {snap.transport or '-'}: {snap.state.value}"
            f" (backoff {snap.current_recovery_s:g} s{retry}, "
            f"{snap.total_failures} failures / {snap.total_successes} successes)"
        )
    header = f"circuits: {len(lines)} of {len(rows)} not closed"
    return "\n".join([header, *lines])
