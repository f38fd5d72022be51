"""The cluster's lock table as plain data, and the pure operations on it: acquire, renew,
release, expiry and a new coordinator's take-over. Every change bumps the table's version
`[term, seq]`; a grant's fence is the version of the change that granted it, so fences strictly
increase across changes and across terms (a new coordinator writes under a higher term).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import Len
from pydantic import (
    ConfigDict,
    Field,
    JsonValue,
    NonNegativeInt,
    PlainSerializer,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
)

from node.errors import LockError
from node.locks.checkpoints import CheckpointLog
from node.openapi import Number

WAITER_GRACE_S = 10.0
"""A waiter that has not asked again for this long (or its ttl_s, if longer) leaves the queue."""


@dataclass(frozen=True, order=True)
class LockFence:
    """`[term, seq]`: compared as a pair; a newer grant has a larger fence."""

    term: int
    seq: int

    def to_list(self) -> list[int]:
        return [self.term, self.seq]

    @classmethod
    def parse(cls, value: object) -> LockFence:
        """A fence from `[term, seq]`; LockError 400 otherwise."""
        if (
            isinstance(value, list | tuple)
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        ):
            return cls(int(value[0]), int(value[1]))
        raise LockError(400, "bad_fence", f"a fence is [term, seq] of two integers, not {value!r}")


def _fence_of(value: object) -> LockFence:
    if isinstance(value, LockFence):
        return value
    try:
        return LockFence.parse(value)
    except LockError as exc:
        raise ValueError(exc.reason) from None


WireFence = Annotated[
    LockFence,
    PlainValidator(_fence_of),
    PlainSerializer(LockFence.to_list),
    WithJsonSchema(TypeAdapter(Annotated[list[NonNegativeInt], Len(2, 2)]).json_schema()),
]
"""A LockFence on the wire: `[term, seq]`."""


@dataclass(frozen=True)
class Waiter:
    holder: str
    ttl_s: float
    expires_at: float


@dataclass(frozen=True)
class LockState:
    """One lock: its holder (None: free), the holder's fence and lease end, the FIFO waiters."""

    holder: str | None = None
    fence: WireFence | None = None
    ttl_s: float = 0.0
    expires_at: float = 0.0
    waiters: tuple[Waiter, ...] = ()

    def position_of(self, holder: str) -> int | None:
        """0 for the holder, N >= 1 for the N-th waiter, None when absent."""
        if self.holder == holder:
            return 0
        for index, waiter in enumerate(self.waiters):
            if waiter.holder == holder:
                return index + 1
        return None


@dataclass(frozen=True)
class Quarantine:
    """A node quarantined for a GPU fault (node.quarantine): `reason` names the GPU and the
    fault (`gpu_fault: Xid 79 on GPU-...`); `active` until it is re-admitted; `times` when it
    was quarantined within the limit's window (wall clock, oldest first); `held` once that
    reached the limit: only an undrain lifts it."""

    reason: str
    since: float
    active: bool = True
    times: tuple[float, ...] = ()
    held: bool = False


def _absent(value: object) -> bool:
    return value is None


@dataclass(frozen=True)
class Drain:
    """A drained node (`shoal node drain`): its running jobs are killed after `kill_after_s`
    seconds (None: they finish); `since` (wall clock) and `by` (the sender who asked) are left
    out of the JSON when unknown."""

    kill_after_s: Number | None
    since: Annotated[Number | None, Field(exclude_if=_absent)] = None
    by: Annotated[str | None, Field(exclude_if=_absent)] = None


StoredRun = dict[str, JsonValue]
"""A queued run's record as the lock table stores it: the JSON of node.runs' RunRecord, which
sits above the locks (its job is a node.jobs JobRecord), so it is read as RunRecord there."""


def _version_default_as_json(schema: dict[str, Any]) -> None:
    """JSON Schema writes a default as plain JSON, not through the field's serializer."""
    schema["properties"]["version"]["default"] = LockFence(0, 0).to_list()


@dataclass(frozen=True)
class LockTable:
    """Every lock of the cluster; `version` is the fence of the newest change."""

    __pydantic_config__ = ConfigDict(json_schema_extra=_version_default_as_json)

    version: WireFence = LockFence(0, 0)
    locks: Mapping[str, LockState] = dataclasses.field(default_factory=dict)
    runs: Mapping[str, StoredRun] = dataclasses.field(default_factory=dict)
    """The queued runs' records as JSON (node.runs reads them as RunRecord), stored with the
    locks on the same majority."""
    drains: Mapping[str, Drain] = dataclasses.field(default_factory=dict)
    """The drained nodes (`shoal node drain`), kept on the same majority so a new coordinator
    plans with them; a table without the field (an older release's) drains nobody."""
    quarantines: Mapping[str, Quarantine] = dataclasses.field(default_factory=dict)
    """The nodes quarantined for a GPU fault, and those re-admitted within the limit's window
    (node.locks.quarantines); a table without the field quarantines nobody."""
    checkpoints: CheckpointLog = dataclasses.field(default_factory=CheckpointLog)
    """The committed training checkpoints and the nodes' last restores (node.checkpoints), on
    the same majority so a new coordinator knows the step to restore; a table without the field
    (an older release's) has committed none."""

    def get(self, name: str) -> LockState:
        return self.locks.get(name, LockState())

    def ordered(self) -> LockTable:
        """The same table with its locks, runs, drains and quarantines sorted by name (how its
        JSON lists them)."""
        return dataclasses.replace(
            self,
            locks=dict(sorted(self.locks.items())),
            runs=dict(sorted(self.runs.items())),
            drains=dict(sorted(self.drains.items())),
            quarantines=dict(sorted(self.quarantines.items())),
        )

    def to_dict(self) -> dict[str, Any]:
        """The table as JSON (LOCK_TABLE's schema): locks and runs sorted by name."""
        dumped: dict[str, Any] = LOCK_TABLE.dump_python(self.ordered(), mode="json")
        return dumped

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LockTable:
        """A table from its JSON; LockError 400 naming what is wrong otherwise."""
        try:
            return LOCK_TABLE.validate_python(dict(data))
        except (ValidationError, TypeError, ValueError) as exc:
            raise LockError(
                400, "bad_lock_table", f"a lock table that cannot be read: {exc}"
            ) from exc


@dataclass(frozen=True)
class LockAnswer:
    """What an acquire answers: granted (position 0 and the fence) or the queue position."""

    name: str
    holder: str
    granted: bool
    fence: WireFence | None
    position: int | None
    expires_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The answer as JSON (LOCK_ANSWER's schema)."""
        dumped: dict[str, Any] = LOCK_ANSWER.dump_python(self, mode="json")
        return dumped

    @classmethod
    def from_dict(cls, data: object) -> LockAnswer:
        """An answer from its JSON (what a node answered); LockError 502 otherwise."""
        try:
            return LOCK_ANSWER.validate_python(data)
        except ValidationError as exc:
            raise LockError(502, "bad_lock_answer", f"not a lock answer: {exc}") from exc


LOCK_TABLE: TypeAdapter[LockTable] = TypeAdapter(LockTable)
"""Validation, JSON and JSON Schema of a LockTable (the store's and GET /v1/locks' shape)."""
LOCK_ANSWER: TypeAdapter[LockAnswer] = TypeAdapter(LockAnswer)
"""Validation, JSON and JSON Schema of a LockAnswer (what acquire and renew answer)."""


def _bump(table: LockTable, term: int) -> LockFence:
    if term < table.version.term:
        raise LockError(
            409,
            "stale_term",
            f"term {term} is older than the lock table's term {table.version.term}",
        )
    seq = table.version.seq + 1 if term == table.version.term else 1
    return LockFence(term, seq)


def next_version(table: LockTable, term: int) -> LockFence:
    """The version of the next change of `table` under `term`; LockError 409 for a term older
    than the table's."""
    return _bump(table, term)


def _with(table: LockTable, version: LockFence, name: str, state: LockState) -> LockTable:
    locks = dict(table.locks)
    if state.holder is None and not state.waiters:
        locks.pop(name, None)
    else:
        locks[name] = state
    return dataclasses.replace(table, version=version, locks=locks)


def _grant_next(state: LockState, fence: LockFence, now: float) -> LockState:
    """The lock passed to its first waiter (or freed)."""
    if not state.waiters:
        return LockState()
    first, rest = state.waiters[0], state.waiters[1:]
    return LockState(first.holder, fence, first.ttl_s, now + first.ttl_s, rest)


def expire(table: LockTable, term: int, now: float) -> LockTable:
    """Drop waiters that stopped asking and holders whose lease ran out (passing the lock on);
    the same table when nothing expired."""
    for name in sorted(table.locks):
        state = table.locks[name]
        waiters = tuple(w for w in state.waiters if w.expires_at > now)
        if state.holder is not None and state.expires_at <= now:
            fence = _bump(table, term)
            state = dataclasses.replace(state, waiters=waiters)
            table = _with(table, fence, name, _grant_next(state, fence, now))
        elif waiters != state.waiters:
            fence = _bump(table, term)
            changed = dataclasses.replace(state, waiters=waiters)
            if changed.holder is None:
                changed = _grant_next(changed, fence, now)
            table = _with(table, fence, name, changed)
    return table


def _waiter_expiry(ttl_s: float, now: float) -> float:
    return now + max(ttl_s, WAITER_GRACE_S)


def acquire(
    table: LockTable, term: int, name: str, holder: str, ttl_s: float, wait: bool, now: float
) -> tuple[LockTable, LockAnswer]:
    """Grant `name` to `holder` when free; otherwise queue it (`wait`) or answer not granted.
    Asking again is idempotent: a holder renews its lease, a waiter keeps its place."""
    state = table.get(name)
    if state.holder == holder:
        return renew(table, term, name, holder, state.fence, now)
    position = state.position_of(holder)
    if state.holder is None and not state.waiters:
        fence = _bump(table, term)
        granted = LockState(holder, fence, ttl_s, now + ttl_s)
        answer = LockAnswer(name, holder, True, fence, 0, granted.expires_at)
        return _with(table, fence, name, granted), answer
    if position is not None:
        waiters = tuple(
            Waiter(w.holder, ttl_s, _waiter_expiry(ttl_s, now)) if w.holder == holder else w
            for w in state.waiters
        )
        fence = _bump(table, term)
        changed = _with(table, fence, name, dataclasses.replace(state, waiters=waiters))
        return changed, LockAnswer(name, holder, False, None, position)
    if not wait:
        return table, LockAnswer(name, holder, False, None, None)
    waiter = Waiter(holder, ttl_s, _waiter_expiry(ttl_s, now))
    fence = _bump(table, term)
    queued = dataclasses.replace(state, waiters=(*state.waiters, waiter))
    answer = LockAnswer(name, holder, False, None, len(queued.waiters))
    return _with(table, fence, name, queued), answer


def check_holder(table: LockTable, name: str, holder: str, fence: LockFence | None) -> LockState:
    """The lock's state when `holder` holds it under `fence`; LockError 409 otherwise (an older
    fence is `stale_lock_fence`: a lock-protected action of a holder that lost the lock)."""
    state = table.get(name)
    if state.holder != holder:
        raise LockError(
            409,
            "not_holder",
            f"lock {name!r} is held by {state.holder or 'nobody'}, not {holder!r}; "
            "acquire it again",
        )
    if fence is not None and state.fence != fence:
        current = None if state.fence is None else state.fence.to_list()
        raise LockError(
            409,
            "stale_lock_fence",
            f"lock {name!r}: fence {fence.to_list()} is not the current grant {current}",
        )
    return state


def renew(
    table: LockTable, term: int, name: str, holder: str, fence: LockFence | None, now: float
) -> tuple[LockTable, LockAnswer]:
    """Extend the holder's lease by its ttl_s from `now`."""
    state = check_holder(table, name, holder, fence)
    version = _bump(table, term)
    renewed = dataclasses.replace(state, expires_at=now + state.ttl_s)
    answer = LockAnswer(name, holder, True, state.fence, 0, renewed.expires_at)
    return _with(table, version, name, renewed), answer


def release(
    table: LockTable, term: int, name: str, holder: str, fence: LockFence | None, now: float
) -> LockTable:
    """The holder gives the lock up; the first waiter gets it at once."""
    state = check_holder(table, name, holder, fence)
    version = _bump(table, term)
    return _with(table, version, name, _grant_next(state, version, now))


def take_over(table: LockTable, term: int, now: float) -> LockTable:
    """The table a new coordinator of `term` serves: every lease and waiter runs at least one
    full ttl_s from `now` (the holders renew with the new coordinator), under the new term."""
    version = _bump(table, term)
    locks = {
        name: dataclasses.replace(
            state,
            expires_at=max(state.expires_at, now + state.ttl_s),
            waiters=tuple(
                dataclasses.replace(w, expires_at=max(w.expires_at, _waiter_expiry(w.ttl_s, now)))
                for w in state.waiters
            ),
        )
        for name, state in table.locks.items()
    }
    return dataclasses.replace(table, version=version, locks=locks)


def put_run(table: LockTable, term: int, run_id: str, record: StoredRun) -> LockTable:
    """The table with run `run_id`'s record replaced (one change: a new version)."""
    runs = dict(table.runs)
    runs[run_id] = dict(record)
    return dataclasses.replace(table, version=_bump(table, term), runs=runs)


def put_drain(table: LockTable, term: int, node: str, record: Drain | None) -> LockTable:
    """The table with `node` drained (`record`) or undrained (None); the same table when
    nothing changes."""
    drains = dict(table.drains)
    if record is None:
        if node not in drains:
            return table
        del drains[node]
    else:
        if drains.get(node) == record:
            return table
        drains[node] = record
    return dataclasses.replace(table, version=_bump(table, term), drains=drains)


def put_checkpoints(table: LockTable, term: int, log: CheckpointLog) -> LockTable:
    """The table with its checkpoint log replaced (one change), or the same table when equal."""
    if log == table.checkpoints:
        return table
    return dataclasses.replace(table, version=_bump(table, term), checkpoints=log)


def drain_map(table: LockTable) -> dict[str, float | None]:
    """node id -> kill_after_s of every drained node (the plan's `draining`)."""
    return {
        node: None if drain.kill_after_s is None else float(drain.kill_after_s)
        for node, drain in table.drains.items()
    }
