"""Where copies of a committed step go, without I/O: for each node that wrote files, the other
nodes that should hold a copy, spread over failure domains (the inventory's `zone` and `rack`
labels) and then over nodes, so one lost zone, rack or host never takes every copy.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from config import Inventory
from node.locks.checkpoints import CommittedStep


@dataclass(frozen=True, order=True)
class Domain:
    """A node's failure domains; None where the inventory gives no label."""

    zone: str | None = None
    rack: str | None = None


def domains_of(inventory: Inventory | None) -> dict[str, Domain]:
    """Each inventory host's `zone` and `rack` labels (none without an inventory)."""
    if inventory is None:
        return {}
    return {
        name: Domain(host.labels.get("zone"), host.labels.get("rack"))
        for name, host in inventory.hosts.items()
    }


def _shared(value: str | None, used: Collection[str | None]) -> bool:
    return value is not None and value in used


def choose_holders(
    owner: str,
    candidates: Sequence[str],
    count: int,
    domains: Mapping[str, Domain],
    *,
    keeping: Sequence[str] = (),
    load: Mapping[str, int] | None = None,
) -> tuple[str, ...]:
    """Up to `count` nodes of `candidates` (never `owner` nor those of `keeping`, which hold a
    copy already) to copy `owner`'s files to: first a zone none of owner, keeping or the chosen
    has, then a rack none has, then the node holding the fewest copies (`load`), then the next
    after the owner in id order (so equal owners spread their copies around the ring)."""
    load = dict(load or {})
    ring = sorted({*candidates, owner})
    after = {node: (index - ring.index(owner)) % len(ring) for index, node in enumerate(ring)}
    chosen: list[str] = []
    holding = [owner, *keeping]
    free = [c for c in candidates if c not in holding]
    while free and len(chosen) < count:
        used = [domains.get(n, Domain()) for n in (*holding, *chosen)]
        zones, racks = {d.zone for d in used}, {d.rack for d in used}

        def preference(
            node: str, zones: set[str | None] = zones, racks: set[str | None] = racks
        ) -> tuple[bool, bool, int, int]:
            domain = domains.get(node, Domain())
            return (
                _shared(domain.zone, zones),
                _shared(domain.rack, racks),
                load.get(node, 0),
                after[node],
            )

        best = min(free, key=preference)
        chosen.append(best)
        free.remove(best)
    return tuple(chosen)


def plan_replicas(
    owners: Sequence[str],
    candidates: Sequence[str],
    replicas: int,
    domains: Mapping[str, Domain],
    *,
    holders: Mapping[str, Sequence[str]] | None = None,
    alive: Sequence[str] | None = None,
) -> dict[str, tuple[str, ...]]:
    """For each of `owners` the nodes of `candidates` to ask for a copy, so that `replicas`
    `alive` nodes (default: the candidates) other than the owner hold one, counting `holders`
    (owner -> nodes that hold or were asked already). Owners are served in order; a node asked
    once counts as loaded for the next."""
    holders = holders or {}
    alive_set = set(candidates if alive is None else alive) | set(candidates)
    load: dict[str, int] = {}
    for nodes in holders.values():
        for node in nodes:
            load[node] = load.get(node, 0) + 1
    plan: dict[str, tuple[str, ...]] = {}
    for owner in owners:
        keeping = [n for n in holders.get(owner, ()) if n != owner and n in alive_set]
        missing = replicas - len(keeping)
        if missing <= 0:
            continue
        chosen = choose_holders(
            owner, sorted(set(candidates)), missing, domains, keeping=keeping, load=load
        )
        for node in chosen:
            load[node] = load.get(node, 0) + 1
        if chosen:
            plan[owner] = chosen
    return plan


def repairs(
    record: CommittedStep,
    alive: Sequence[str],
    replicas: int,
    domains: Mapping[str, Domain],
    candidates: Sequence[str] | None = None,
) -> dict[str, tuple[str, ...]]:
    """The extra nodes (of `candidates`, default every alive node) to ask for copies of
    `record` so every owner's files again have `replicas` alive copies on other nodes (holders
    and pending targets count)."""
    asked = {
        owner: (*record.holders.get(owner, ()), *record.targets.get(owner, ()))
        for owner in record.files
    }
    chosen = alive if candidates is None else candidates
    return plan_replicas(
        sorted(record.files), chosen, replicas, domains, holders=asked, alive=alive
    )
