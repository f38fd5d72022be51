"""How a training process finds its place in a generation: waiting for the local daemon's
rendezvous (of a generation above one it left), the settings read from its environment, and the
record of how an in-place session came to its state (shoal.session uses them)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from shoal._daemon import DaemonClient
from shoal.errors import DaemonUnreachableError, GroupError, ShoalError
from shoal.place import RankPlace
from shoal.rendezvous import Rendezvous, fetch_rendezvous

__all__ = ["ENV_AFTER_GENERATION", "ENV_REFORM", "Reform"]

POLL_S = 0.2
ENV_REFORM = "SHOAL_REFORM"
"""`in_place` (the node's training_reform): a change of the group is met by `reform`, not by a
new process."""
ENV_AFTER_GENERATION = "SHOAL_AFTER_GENERATION"
"""A replacement the launcher starts before the next generation exists waits for a rendezvous of
a newer generation than this one."""
WATCH_S = 0.5
"""How often an in-place session asks its daemon whether a newer generation is ready."""


def seconds_from(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    try:
        value = float(text) if text else default
    except ValueError:
        raise ShoalError(f"{name}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise ShoalError(f"{name}={text!r} must be above 0")
    return value


def with_node(place: RankPlace, node_id: str | None) -> RankPlace:
    """`place` naming `node_id` where it names no node (the daemon's answer does not)."""
    if place.node_id is None and node_id is not None:
        return dataclasses.replace(place, node_id=node_id)
    return place


def wait_for_rank(
    client: DaemonClient, local_rank: int, timeout_s: float, after: int = -1
) -> Rendezvous:
    """Ask the daemon for `local_rank`'s rendezvous of a generation above `after` until it
    gives one; GroupError after `timeout_s` naming the last answer."""
    deadline = time.monotonic() + timeout_s
    problem = "no answer yet"
    while True:
        left_s = deadline - time.monotonic()
        try:
            found = fetch_rendezvous(client, local_rank, max(0.1, min(left_s, 5.0)))
        except DaemonUnreachableError as exc:
            found, problem = None, str(exc)
        else:
            if found is None:
                problem = "this node has no training rank (yet)"
            elif found.generation <= after:
                problem = f"generation {found.generation} is not above {after} yet"
                found = None
        if found is not None:
            return found
        if left_s <= 0:
            raise GroupError(f"no rank from {client.url} in {timeout_s:.0f} s: {problem}")
        time.sleep(min(POLL_S, max(0.0, left_s)))


@dataclasses.dataclass(frozen=True, slots=True)
class Reform:
    """How an in-place session came to its state in `generation`: `step` from `source` --
    "memory" (this rank held the newest step), "peer" (rank `from_rank` sent `bytes`), or
    "checkpoint" (no rank held live state; the newest committed step, None: none) -- in
    `seconds` (the agreement, the transfer or the restore; forming the group not counted)."""

    generation: int
    step: int | None
    source: str
    from_rank: int | None
    bytes: int
    seconds: float
