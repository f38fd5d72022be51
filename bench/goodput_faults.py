"""The faults of bench/goodput_bench.py: their kinds, how long each lasts, and the seeded
schedule both systems get (one fault every `every_s`, the first half a period in).

Kinds (issue 33): a worker's SIGKILL, a host's SIGKILL (down HOST_DOWN_S, then back), a
worker's SIGSTOP (a hang), an injected Xid 79 (cleared after XID_S), a host partitioned for
PARTITION_S, a host's data dir wiped and the host restarted. The order is a seeded shuffle of
the six kinds, repeated, so every six faults hold each kind once; the host of each fault is
drawn from the same generator.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

__all__ = [
    "HOST_DOWN_S",
    "PARTITION_S",
    "XID_S",
    "FaultKind",
    "PlannedFault",
    "schedule",
]

HOST_DOWN_S = 30.0
XID_S = 30.0
PARTITION_S = 20.0


class FaultKind(enum.StrEnum):
    WORKER_KILL = "worker_kill"
    HOST_KILL = "host_kill"
    WORKER_HANG = "worker_hang"
    XID = "xid"
    PARTITION = "partition"
    WIPE = "wipe"

    @property
    def lasts_s(self) -> float:
        """How long the fault stays before the bench undoes it (0: nothing to undo)."""
        return {
            FaultKind.HOST_KILL: HOST_DOWN_S,
            FaultKind.XID: XID_S,
            FaultKind.PARTITION: PARTITION_S,
        }.get(self, 0.0)


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """Fault number `index` of the run: `kind` on host `host` (an index), `at_s` seconds after
    the training started."""

    index: int
    kind: FaultKind
    host: int
    at_s: float


def schedule(
    minutes: float,
    seed: int,
    hosts: int,
    *,
    every_s: float = 60.0,
    kinds: tuple[FaultKind, ...] = tuple(FaultKind),
    first_s: float | None = None,
) -> list[PlannedFault]:
    """The faults of a run of `minutes`: one every `every_s` from `first_s` (default
    `every_s / 2`) on, while one
    fits before the end; kinds in a seeded shuffle of `kinds`, repeated; hosts drawn from the
    same generator (`seed` gives the same schedule to both systems and to a re-run)."""
    if hosts < 2:
        raise ValueError(f"faults need at least 2 hosts, not {hosts}")
    rng = random.Random(seed)
    planned: list[PlannedFault] = []
    order: list[FaultKind] = []
    at_s = every_s / 2 if first_s is None else first_s
    while at_s < minutes * 60.0:
        if not order:
            order = list(kinds)
            rng.shuffle(order)
        planned.append(PlannedFault(len(planned), order.pop(0), rng.randrange(hosts), at_s))
        at_s += every_s
    return planned
