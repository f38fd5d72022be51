"""The adoption log: each coordinator and plan a node adopts, one fsynced JSON line each, and the
pure checker that reads every node's log for split brain and plans going backwards.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from config import AsyncClosing, fsync_directory
from node.election.state import ElectionEvent, ElectionEventKind
from node.errors import PlanError

log = logging.getLogger("node.election.elector")

RecordKind = Literal["coordinator", "plan"]


class AdoptionJson(TypedDict):
    """An AdoptionRecord as one line of the log."""

    time: float
    node: str
    kind: RecordKind
    term: int
    coordinator: str | None
    plan_term: int | None
    plan_version: int | None
    plan_digest: str | None
    backers: list[str] | None


@dataclass(frozen=True, slots=True)
class AdoptionRecord:
    """A node adopted `coordinator` for `term` (kind "coordinator") or a plan (kind "plan").

    `time` is wall-clock seconds, for people only: the checker never compares it across nodes.
    `backers` are the voters that held the coordinator's lease when it published the plan
    (set only in the coordinator's own plan records).
    """

    time: float
    node: str
    kind: RecordKind
    term: int
    coordinator: str | None
    plan_term: int | None = None
    plan_version: int | None = None
    plan_digest: str | None = None
    backers: tuple[str, ...] | None = None

    def to_dict(self) -> AdoptionJson:
        return {
            "time": self.time,
            "node": self.node,
            "kind": self.kind,
            "term": self.term,
            "coordinator": self.coordinator,
            "plan_term": self.plan_term,
            "plan_version": self.plan_version,
            "plan_digest": self.plan_digest,
            "backers": None if self.backers is None else list(self.backers),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> AdoptionRecord:
        """The record of a log line; PlanError naming the field that is missing or malformed."""
        try:
            kind = data["kind"]
            if kind != "coordinator" and kind != "plan":
                raise PlanError(f"adoption record kind {kind!r} is unknown")
            time, term, backers = data["time"], data["term"], data.get("backers")
            if isinstance(time, bool) or not isinstance(time, int | float | str):
                raise ValueError(f"time {time!r} is not a number")
            if isinstance(term, bool) or not isinstance(term, int | str):
                raise ValueError(f"term {term!r} is not an integer")
            if backers is not None and not isinstance(backers, list):
                raise ValueError(f"backers {backers!r} is not a list")
            return cls(
                time=float(time),
                node=str(data["node"]),
                kind=kind,
                term=int(term),
                coordinator=_optional_str(data.get("coordinator")),
                plan_term=_optional_int("plan_term", data.get("plan_term")),
                plan_version=_optional_int("plan_version", data.get("plan_version")),
                plan_digest=_optional_str(data.get("plan_digest")),
                backers=None if backers is None else tuple(str(b) for b in backers),
            )
        except KeyError as exc:
            raise PlanError(f"adoption record {dict(data)!r} lacks {exc}") from exc
        except ValueError as exc:
            raise PlanError(f"adoption record {dict(data)!r} is malformed: {exc}") from exc


class AdoptionLog(AsyncClosing):
    """Appends records to `path` as JSON lines, each fsynced before `append` returns.

    Appends are serialised, so records land in the order `append` was called.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def append(self, record: AdoptionRecord) -> None:
        line = json.dumps(record.to_dict(), separators=(",", ":")) + "\n"
        async with self._lock:
            if self._closed:
                raise PlanError(f"adoption log {self.path} is closed")
            await asyncio.to_thread(self._write, line.encode())

    async def close(self) -> None:
        """Close the file; idempotent, and no append succeeds afterwards."""
        async with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if created:
                fsync_directory(self.path.parent)
        os.write(self._fd, data)
        os.fsync(self._fd)


def read_adoption_log(path: Path | str) -> list[AdoptionRecord]:
    """The records of one log. A torn last line (a crash mid-append) is skipped; a bad line
    elsewhere raises PlanError naming it."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    records: list[AdoptionRecord] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(AdoptionRecord.from_dict(json.loads(line)))
        except (ValueError, PlanError) as exc:
            if number == len(lines):
                break
            raise PlanError(f"{path}:{number}: {exc}") from exc
    return records


def check_adoption_logs(
    logs: Mapping[str, Sequence[AdoptionRecord]], voters: Sequence[str]
) -> list[str]:
    """Violations across every node's log: two coordinators in one term, a coordinator that is
    not a voter, a node whose plans go backwards, two plans under one fence, a plan published
    without a majority of voters behind it. Empty when all is well."""
    voter_set = frozenset(voters)
    quorum = len(voter_set) // 2 + 1
    problems: list[str] = []
    coordinators: dict[int, set[str]] = defaultdict(set)
    digests: dict[tuple[int, int], set[str]] = defaultdict(set)
    for node, records in sorted(logs.items()):
        last: tuple[int, int] | None = None
        for record in records:
            if record.coordinator is not None:
                coordinators[record.term].add(record.coordinator)
            if record.kind != "plan":
                continue
            if record.plan_term is None or record.plan_version is None:
                problems.append(f"{node}: plan record without a fence at term {record.term}")
                continue
            fence = (record.plan_term, record.plan_version)
            if last is not None and fence <= last:
                problems.append(f"{node}: plan {_fence(fence)} adopted after {_fence(last)}")
            last = fence if last is None else max(last, fence)
            if record.plan_digest is not None:
                digests[fence].add(record.plan_digest)
            if record.backers is not None and len(voter_set & set(record.backers)) < quorum:
                problems.append(
                    f"{node}: plan {_fence(fence)} published with {sorted(record.backers)} "
                    f"behind it, fewer than {quorum} of {len(voter_set)} voters"
                )
    for term, names in sorted(coordinators.items()):
        if len(names) > 1:
            problems.append(f"term {term}: {len(names)} coordinators {sorted(names)}")
        problems.extend(
            f"term {term}: coordinator {name} is not a voter" for name in sorted(names - voter_set)
        )
    for fence, found in sorted(digests.items()):
        if len(found) > 1:
            problems.append(f"plan {_fence(fence)}: {len(found)} different plans under one fence")
    return problems


def _fence(fence: tuple[int, int]) -> str:
    return f"{fence[0]}.{fence[1]}"


def _optional_int(field: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{field} {value!r} is not an integer")
    return value


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def adoption_record(
    event: ElectionEvent, time: float, backers: tuple[str, ...] | None = None
) -> AdoptionRecord | None:
    """The record of a coordinator or plan adoption event; None for other events."""
    status = event.status
    plan = event.plan
    if event.kind is ElectionEventKind.COORDINATOR_CHANGED:
        return AdoptionRecord(time, status.node_id, "coordinator", status.term, status.coordinator)
    if event.kind is not ElectionEventKind.PLAN_ADOPTED or plan is None:
        return None
    return AdoptionRecord(
        time=time,
        node=status.node_id,
        kind="plan",
        term=status.term,
        coordinator=status.coordinator,
        plan_term=plan.term,
        plan_version=plan.version,
        plan_digest=plan.digest,
        backers=backers,
    )


async def record_adoption(
    adoptions: AdoptionLog | None,
    event: ElectionEvent,
    now: float,
    backers: tuple[str, ...] | None,
    node_id: str,
) -> None:
    """Append `event` to the adoption log when it is an adoption; a failed write is logged."""
    if adoptions is None:
        return
    record = adoption_record(event, now, backers)
    if record is None:
        return
    try:
        await adoptions.append(record)
    except (OSError, PlanError) as exc:
        log.warning("node %s: adoption log write failed: %s", node_id, exc)
