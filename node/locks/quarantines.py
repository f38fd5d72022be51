"""GPU quarantines in the lock table, kept on a majority of the voters like drains: quarantine a
node for a GPU fault, re-admit it once its GPUs pass a self-test, lift it (`shoal node undrain`),
and the quarantined nodes a plan keeps out of training. A node quarantined `limit` times within
WINDOW_S is held: it is re-admitted only by an undrain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from node.errors import LockError
from node.locks.table import LockTable, Quarantine, next_version

WINDOW_S = 3600.0
"""The window of the quarantine limit: a node quarantined `gpu_quarantine_limit` times within
it stays out until an operator undrains it."""


def quarantine(
    table: LockTable,
    term: int,
    node: str,
    reason: str,
    now: float,
    limit: int,
    window_s: float = WINDOW_S,
) -> tuple[LockTable, Quarantine, bool]:
    """The table with `node` quarantined for `reason` at wall time `now`, its record, and
    whether this call quarantined it (False: it already was; a repeated report changes
    nothing). The quarantine that makes `limit` within `window_s` is held."""
    record = table.quarantines.get(node)
    if record is not None and record.active:
        return table, record, False
    earlier = () if record is None else record.times
    times = (*(at for at in earlier if now - at < window_s), now)
    record = Quarantine(reason, now, True, times, len(times) >= limit)
    quarantines = _recent(table.quarantines, now, window_s)
    quarantines[node] = record
    changed = dataclasses.replace(table, version=next_version(table, term), quarantines=quarantines)
    return changed, record, True


def readmit(
    table: LockTable, term: int, node: str, now: float, window_s: float = WINDOW_S
) -> tuple[LockTable, bool]:
    """The table with `node` back (its record kept, inactive, for the limit's window), and
    whether this call re-admitted it (False: it was not quarantined). LockError 409
    `quarantine_held` when the quarantine is held."""
    record = table.quarantines.get(node)
    if record is None or not record.active:
        return table, False
    if record.held:
        raise LockError(
            409,
            "quarantine_held",
            f"node {node} was quarantined {len(record.times)} times within "
            f"{window_s:g} s; it stays out until an operator runs: shoal node undrain {node}",
        )
    quarantines = _recent(table.quarantines, now, window_s)
    quarantines[node] = dataclasses.replace(record, active=False)
    changed = dataclasses.replace(table, version=next_version(table, term), quarantines=quarantines)
    return changed, True


def lift(table: LockTable, term: int, node: str) -> LockTable:
    """The table without `node`'s quarantine or its history (an undrain); the same table when
    it has none."""
    if node not in table.quarantines:
        return table
    quarantines = dict(table.quarantines)
    del quarantines[node]
    return dataclasses.replace(table, version=next_version(table, term), quarantines=quarantines)


def quarantine_map(table: LockTable) -> dict[str, str]:
    """node id -> reason of every quarantined node (the plan's `quarantined`); a held one's
    reason says how it comes back."""
    return {
        node: held_reason(node, record) if record.held else record.reason
        for node, record in table.quarantines.items()
        if record.active
    }


def held_reason(node: str, record: Quarantine) -> str:
    """The reason of a held quarantine as plans show it."""
    return (
        f"{record.reason} (quarantined {len(record.times)} times within "
        f"{WINDOW_S / 3600:g} h: stays out until shoal node undrain {node})"
    )


def _recent(
    quarantines: Mapping[str, Quarantine], now: float, window_s: float
) -> dict[str, Quarantine]:
    """The records still of use: active ones, and re-admitted ones quarantined within the
    window."""
    return {
        node: record
        for node, record in quarantines.items()
        if record.active or any(now - at < window_s for at in record.times)
    }
