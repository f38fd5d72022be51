"""health: circuit breakers per peer and transport, health checks, Prometheus metrics.

May import config and wal only; sync and node import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from health.breaker import CircuitBreaker
    from health.breaker_config import (
        BreakerConfig,
        BreakerSnapshot,
        CircuitState,
        Clock,
        StateListener,
        counts_as_failure,
    )
    from health.checker import HealthChecker
    from health.checks import (
        DiskWrites,
        WalLike,
        WalStatsLike,
        WriteFailure,
        disk_check,
        disk_usage,
        memory_check,
        read_rss_bytes,
        wal_backlog_check,
        wal_check,
    )
    from health.errors import (
        CircuitOpenError,
        FetchError,
        FetchTimeoutError,
        HealthConfigError,
        HealthError,
        MonitorError,
        UsageError,
    )
    from health.gpu import ENV_FAKE_GPUS, GpuInfo, GpuReader, fake_gpu_uuids, gpu_check, read_gpus
    from health.gpu_fake import FakeGpu, write_fake_gpus
    from health.gpu_faults import (
        GPU_ID_HEX_DIGITS,
        FaultKind,
        FaultSample,
        FaultVerdict,
        GpuFault,
        RecoveryAction,
        judge,
        short_gpu_id,
    )
    from health.gpu_selftest import SelfTestResult, run_selftest
    from health.loops import LoopHealth
    from health.metrics import NodeMetrics, package_version
    from health.monitor.client import ClusterMonitor
    from health.monitor.model import ClusterStatus, ClusterSummary, FailureEvent, NodeRow
    from health.monitor.options import MONITOR_FLAGS, MonitorFlag, MonitorOptions, options_from
    from health.monitor.render import render_dashboard, render_text
    from health.monitor.run import run_monitor
    from health.registry import (
        BreakerRegistry,
        TransitionListener,
        all_breakers,
        breaker_for,
        configure_breakers,
        default_registry,
        format_breakers,
        reset_all_breakers,
    )
    from health.status import (
        CheckFn,
        CheckResult,
        ComponentHealth,
        ComponentJson,
        HealthJson,
        HealthStatus,
        HealthSummary,
        SummaryListener,
        format_health_report,
        summarize,
    )
    from health.xids import XID_TABLE, XidAction, XidEntry, xid_action
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
