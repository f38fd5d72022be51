"""Health as plain data: statuses, check results, components, summaries, and their text form.

Pure values and functions; HealthChecker (checker.py) produces them.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

__all__ = [
    "CheckFn",
    "CheckResult",
    "ComponentHealth",
    "HealthStatus",
    "HealthSummary",
    "SummaryListener",
    "format_health_report",
    "summarize",
]


class HealthStatus(enum.StrEnum):
    """How a component is; NOT_APPLICABLE (no GPU on a CPU host) never worsens a summary."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    NOT_APPLICABLE = "not_applicable"

    @property
    def severity(self) -> int:
        """0 healthy, 1 degraded, 2 unhealthy, -1 not applicable (the metrics gauge value)."""
        return _SEVERITY[self]


_SEVERITY = {
    HealthStatus.NOT_APPLICABLE: -1,
    HealthStatus.HEALTHY: 0,
    HealthStatus.DEGRADED: 1,
    HealthStatus.UNHEALTHY: 2,
}


@dataclass(frozen=True)
class CheckResult:
    """What one run of a check found; `metrics` are numbers worth showing (used_pct, rss_mb)."""

    status: HealthStatus
    message: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)


CheckFn = Callable[[], Awaitable[CheckResult]]


class ComponentJson(TypedDict):
    """A component's health as JSON (ComponentHealth.to_dict)."""

    name: str
    status: str
    message: str
    last_check: float | None
    metrics: dict[str, float]


class HealthJson(TypedDict):
    """The health summary as JSON (HealthSummary.to_dict)."""

    status: str
    components: list[ComponentJson]


@dataclass(frozen=True)
class ComponentHealth:
    """A component's reported health; `last_check` is Unix time, None before the first run."""

    name: str
    status: HealthStatus
    message: str
    last_check: float | None
    metrics: Mapping[str, float]

    def to_dict(self) -> ComponentJson:
        return ComponentJson(
            name=self.name,
            status=self.status.value,
            message=self.message,
            last_check=self.last_check,
            metrics=dict(self.metrics),
        )


@dataclass(frozen=True)
class HealthSummary:
    """The worst status over the applicable components, and every component."""

    status: HealthStatus
    components: tuple[ComponentHealth, ...]

    def component(self, name: str) -> ComponentHealth | None:
        return next((c for c in self.components if c.name == name), None)

    def to_dict(self) -> HealthJson:
        """JSON: {"status": ..., "components": [{name, status, message, last_check, metrics}]}."""
        return HealthJson(
            status=self.status.value,
            components=[component.to_dict() for component in self.components],
        )


SummaryListener = Callable[[HealthSummary], None]


def summarize(components: tuple[ComponentHealth, ...]) -> HealthSummary:
    """The summary of `components`: healthy when none applies."""
    worst = max(
        (c.status for c in components if c.status is not HealthStatus.NOT_APPLICABLE),
        key=lambda status: status.severity,
        default=HealthStatus.HEALTHY,
    )
    return HealthSummary(worst, components)


_MARK = {
    HealthStatus.HEALTHY: "ok",
    HealthStatus.DEGRADED: "WARN",
    HealthStatus.UNHEALTHY: "FAIL",
    HealthStatus.NOT_APPLICABLE: "n/a",
}


def _age(last_check: float | None, now: float) -> str:
    if last_check is None:
        return "never checked"
    seconds = max(0.0, now - last_check)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _metric_text(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_health_report(
    summary: HealthSummary, *, now: float | None = None, show_metrics: bool = False
) -> str:
    """One headline, then one line per component: mark, name, status, message, age.

    `now` is the Unix time the ages are computed against (default: the current time).
    """
    at = time.time() if now is None else now
    counts: dict[HealthStatus, int] = {}
    for component in summary.components:
        counts[component.status] = counts.get(component.status, 0) + 1
    tally = ", ".join(f"{n} {status.value}" for status, n in counts.items())
    lines = [f"health: {summary.status.value.upper()}" + (f" ({tally})" if tally else "")]
    width = max((len(c.name) for c in summary.components), default=0)
    for component in summary.components:
        mark = _MARK[component.status]
        line = (
            f"  [{mark:>4}] {component.name:<{width}}  {component.status.value:<14} "
            f"{component.message}  ({_age(component.last_check, at)})"
        )
        lines.append(line.rstrip())
        if show_metrics and component.metrics:
            numbers = ", ".join(
                f"{key}={_metric_text(value)}" for key, value in sorted(component.metrics.items())
            )
            lines.append(f"  {'':>6} {'':<{width}}  {numbers}")
    if not summary.components:
        lines.append("  (no checks registered)")
    return "\n".join(lines)
