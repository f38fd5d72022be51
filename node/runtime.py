"""What the HTTP API reads about its node: one object the daemon fills as components start."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, Protocol, TypedDict

from config import NodeSettings
from config.tls.context import TlsContexts
from health import BreakerRegistry, GpuReader, HealthChecker, NodeMetrics
from net import local_url
from node.openapi import WireRecord
from wal import WriteAheadLog


class AutostopDecisionJson(TypedDict):
    """An auto-stop decision (node.providers.decision.AutostopDecision) as JSON: the WAL
    payload's fields (one unknown is left out), then `entry`, `recovered` (only when true) and
    `outcome`."""

    provider: NotRequired[str]
    node: NotRequired[str]
    action: NotRequired[Literal["stop", "release"]]
    idle_s: NotRequired[float]
    window_s: NotRequired[float]
    dry_run: NotRequired[bool]
    decided_at: NotRequired[float]
    entry: NotRequired[int | None]
    recovered: NotRequired[bool]
    outcome: NotRequired[str]


class AutostopStatusJson(TypedDict):
    """The `autostop` object of the status document (node.providers.autostop): `enabled`,
    `state` and `last_decision` always, the rest once auto-stop has started."""

    enabled: bool
    state: str
    provider: NotRequired[str]
    action: NotRequired[str]
    dry_run: NotRequired[bool]
    window_s: NotRequired[float]
    check_interval_s: NotRequired[float]
    gpu_util_threshold: NotRequired[float]
    idle_since: NotRequired[float | None]
    idle_for_s: NotRequired[float]
    busy_reasons: NotRequired[list[str]]
    last_decision: AutostopDecisionJson | None
    last_error: NotRequired[str | None]


class MemberLike(Protocol):
    """One member of the membership view, as the API shows it."""

    @property
    def node_id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def last_seen_s(self) -> float: ...
    @property
    def meta(self) -> Mapping[str, Any]: ...


class MembershipLike(Protocol):
    """The membership view the API reads."""

    def members(self) -> Sequence[Any]: ...
    def counts(self) -> Mapping[str, int]: ...


class DrainView(WireRecord):
    """This node's drain in the plan it applies (`shoal node drain`)."""

    kill_after_s: float | None


class QuarantineView(WireRecord):
    """This node's GPU quarantine (docs/fault-tolerance.md#gpu-faults): the reason (the plan's,
    or the fault read now), the state (faulty, settling, selftest, selftest_failed,
    readmitting, held) and the last self-test, or null."""

    reason: str | None
    state: str
    selftest: str | None


GpuList = Callable[[], list[dict[str, Any]]]
"""What reads the GPUs of the host as /v1/status shows them (one JSON object per GPU)."""


@dataclass(frozen=True)
class StatusParts:
    """The parts of the status document that components own, given to what builds the document
    (the core routes, the dashboard) when it is built; None: the part is absent."""

    jobs: Callable[[], dict[str, int]] | None = None
    """Counts of this node's jobs by state (the status document's `jobs`)."""
    autostop: Callable[[], AutostopStatusJson] | None = None
    """The `autostop` object of the status document (node.providers.own)."""
    training: Callable[[], Mapping[str, Any] | None] | None = None
    """The `training` object of the status document: this node's ranks' generation, count,
    highest step and median steps/s (node.training), None while none reports."""


@dataclass
class NodeRuntime:
    """The live state of one node and the handles its parts share, all given when it is built
    (an API test may leave a handle None)."""

    settings: NodeSettings
    node_id: str
    address: str
    version: str
    breakers: BreakerRegistry
    port: int = 0
    started_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    wal: WriteAheadLog | None = None
    health: HealthChecker | None = None
    metrics: NodeMetrics | None = None
    membership: MembershipLike | None = None
    gpus: GpuList = list
    owned_gpus: tuple[int, ...] = ()
    """NVML indices of the host's GPUs this node owns (`gpus` resolved at startup)."""
    training_nproc: int = 1
    """Processes this node runs in the training group (`training_nproc` resolved at startup)."""
    role: str | None = None
    term: int | None = None
    coordinator: str | None = None
    plan_version: int | None = None
    drain: DrainView | None = None
    """This node's drain in the plan it applies, else None."""
    quarantine: QuarantineView | None = None
    """This node's GPU quarantine (node.quarantine), else None."""
    gpu_reader: GpuReader | None = None
    """The node's NVML reader (the GPU check, status and the fault watcher share it)."""
    notes: list[str] = field(default_factory=list)
    refreshers: list[Callable[[], None]] = field(default_factory=list)
    """Called before status is read, so live fields (term, coordinator) are never stale."""
    tls: TlsContexts | None = None
    """The node's TLS contexts (auth tls or hmac+tls), else None: what its peer calls present
    (node.identity.peer_tls)."""

    def refresh(self) -> None:
        for refresh in self.refreshers:
            refresh()

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_monotonic


def local_daemon_url(runtime: NodeRuntime) -> str:
    """The URL a job on this host reaches its daemon at (SHOAL_DAEMON_URL)."""
    settings = runtime.settings
    return local_url(settings.bind, runtime.port or settings.port)
