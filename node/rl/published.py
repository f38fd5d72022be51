"""What a publish did: its result (PublishResult), and the report of the weights it published
that the local daemon records (POST /v1/weights/applied)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from node.rl.broadcast import ParamInfo
from node.rl.digest import Digest


@dataclass(frozen=True, slots=True)
class PublishResult:
    """One finished publish: who acknowledged, who was left out (they catch up from the file),
    and how long the broadcast and the whole publish took."""

    version: int
    digest: Digest
    acknowledged: tuple[str, ...]
    missing: tuple[str, ...]
    broadcast_s: float
    total_s: float
    path: Path | None
    phases_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent in: prepare (rendezvous, digest), offer, ready, broadcast, ack, file (the
    rest of writing the weights file, which runs beside the acknowledgements), record (the
    daemon's WAL record of the acknowledged version)."""


PHASES = ("offer", "ready", "broadcast", "ack", "file", "record")
"""The phases of a publish after `prepare`, in order (PublishResult.phases_s)."""


def phases_of(started: float, marks: Sequence[float]) -> dict[str, float]:
    """PublishResult.phases_s of a publish begun at `started`: `marks` are the clock at the end
    of prepare and of each of PHASES."""
    phases = {"prepare": marks[0] - started}
    return phases | {name: marks[i + 1] - marks[i] for i, name in enumerate(PHASES)}


class PublishedReportJson(TypedDict):
    """The body of POST /v1/weights/applied (without the digest) for a broadcast publish."""

    run: str
    version: int
    bytes: int
    source: str
    receivers: list[str]
    sent_at: float


def published_report(
    run: str,
    version: int,
    params: Sequence[ParamInfo],
    acknowledged: tuple[str, ...],
    sent_at: float,
) -> PublishedReportJson:
    """The body of POST /v1/weights/applied (without the digest) for a broadcast publish."""
    return PublishedReportJson(
        run=run,
        version=version,
        bytes=sum(p.nbytes for p in params),
        source="broadcast",
        receivers=list(acknowledged),
        sent_at=sent_at,
    )
