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
    from health.monitor.model import (
        ClusterStatus,
        ClusterSummary,
        FailureEvent,
        MonitorError,
        NodeRow,
    )
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
        HealthStatus,
        HealthSummary,
        SummaryListener,
        format_health_report,
        summarize,
    )
    from health.xids import XID_TABLE, XidAction, XidEntry, xid_action
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "health.breaker": "CircuitBreaker",
            "health.breaker_config": (
                "BreakerConfig BreakerSnapshot CircuitState Clock StateListener counts_as_failure"
            ),
            "health.checker": "HealthChecker",
            "health.checks": (
                "DiskWrites WalLike WalStatsLike WriteFailure disk_check disk_usage memory_check "
                "read_rss_bytes wal_backlog_check wal_check"
            ),
            "health.errors": (
                "CircuitOpenError FetchError FetchTimeoutError HealthConfigError HealthError "
                "UsageError"
            ),
            "health.gpu": "ENV_FAKE_GPUS GpuInfo GpuReader fake_gpu_uuids gpu_check read_gpus",
            "health.gpu_fake": "FakeGpu write_fake_gpus",
            "health.gpu_faults": (
                "GPU_ID_HEX_DIGITS FaultKind FaultSample FaultVerdict GpuFault RecoveryAction "
                "judge short_gpu_id"
            ),
            "health.gpu_selftest": "SelfTestResult run_selftest",
            "health.loops": "LoopHealth",
            "health.metrics": "NodeMetrics package_version",
            "health.monitor.client": "ClusterMonitor",
            "health.monitor.model": (
                "ClusterStatus ClusterSummary FailureEvent MonitorError NodeRow"
            ),
            "health.monitor.options": "MONITOR_FLAGS MonitorFlag MonitorOptions options_from",
            "health.monitor.render": "render_dashboard render_text",
            "health.monitor.run": "run_monitor",
            "health.registry": (
                "BreakerRegistry TransitionListener all_breakers breaker_for configure_breakers "
                "default_registry format_breakers reset_all_breakers"
            ),
            "health.xids": "XID_TABLE XidAction XidEntry xid_action",
            "health.status": (
                "CheckFn CheckResult ComponentHealth HealthStatus HealthSummary SummaryListener "
                "format_health_report summarize"
            ),
        },
    )

__all__ = [
    "ENV_FAKE_GPUS",
    "GPU_ID_HEX_DIGITS",
    "MONITOR_FLAGS",
    "XID_TABLE",
    "BreakerConfig",
    "BreakerRegistry",
    "BreakerSnapshot",
    "CheckFn",
    "CheckResult",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitState",
    "Clock",
    "ClusterMonitor",
    "ClusterStatus",
    "ClusterSummary",
    "ComponentHealth",
    "DiskWrites",
    "FailureEvent",
    "FakeGpu",
    "FaultKind",
    "FaultSample",
    "FaultVerdict",
    "FetchError",
    "FetchTimeoutError",
    "GpuFault",
    "GpuInfo",
    "GpuReader",
    "HealthChecker",
    "HealthConfigError",
    "HealthError",
    "HealthStatus",
    "HealthSummary",
    "LoopHealth",
    "MonitorError",
    "MonitorFlag",
    "MonitorOptions",
    "NodeMetrics",
    "NodeRow",
    "RecoveryAction",
    "SelfTestResult",
    "StateListener",
    "SummaryListener",
    "TransitionListener",
    "UsageError",
    "WalLike",
    "WalStatsLike",
    "WriteFailure",
    "XidAction",
    "XidEntry",
    "all_breakers",
    "breaker_for",
    "configure_breakers",
    "counts_as_failure",
    "default_registry",
    "disk_check",
    "disk_usage",
    "fake_gpu_uuids",
    "format_breakers",
    "format_health_report",
    "gpu_check",
    "judge",
    "memory_check",
    "options_from",
    "package_version",
    "read_gpus",
    "read_rss_bytes",
    "render_dashboard",
    "render_text",
    "reset_all_breakers",
    "run_monitor",
    "run_selftest",
    "short_gpu_id",
    "summarize",
    "wal_backlog_check",
    "wal_check",
    "write_fake_gpus",
    "xid_action",
]
