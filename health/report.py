"""Human-readable text of a health summary and of breaker snapshots, for the CLI and logs."""

from __future__ import annotations

import time
from collections.abc import Iterable

from health.breaker import BreakerSnapshot, CircuitState
from health.checker import HealthStatus, HealthSummary

__all__ = ["format_breakers", "format_health_report"]

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
