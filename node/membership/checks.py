"""The health check of this node's membership."""

from __future__ import annotations

from health import CheckFn, CheckResult, HealthStatus
from node.membership.service import Membership


def membership_check(membership: Membership) -> CheckFn:
    """Degraded while this node's own Lifeguard health score says it misses acks or stalls."""

    async def check() -> CheckResult:
        score = membership.local_health
        stalls = membership.stall_count
        dropped = sum(membership.transport_stats().dropped.values())
        metrics = {"local_health": float(score), "stalls": float(stalls), "dropped": float(dropped)}
        if score > 0 or stalls > 0:
            message = (
                f"local health score {score}, {stalls} recent event-loop stalls: this node "
                "is slow to answer probes (CPU starved or blocked loop)"
            )
            return CheckResult(HealthStatus.DEGRADED, message, metrics)
        counts = membership.counts()
        return CheckResult(HealthStatus.HEALTHY, f"{counts.get('alive', 0)} members alive", metrics)

    return check
