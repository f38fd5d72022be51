"""The one table of timeouts: every timeout the daemon uses, in seconds.

Ordering invariant, checked on load: failure detection < collective < quorum < watchdog.
"""

from __future__ import annotations

import itertools

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Timeouts(BaseModel):
    """Every timeout of a node, in seconds. Field descriptions are docs/configuration.md's table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    http_request_s: float = Field(10.0, gt=0, description="One HTTP request to a peer (API calls).")
    peer_status_s: float = Field(
        3.0, gt=0, description="One /v1/status or /v1/peers read by the monitor or CLI."
    )
    probe_interval_s: float = Field(
        0.3, gt=0, description="SWIM protocol period: one direct probe per period."
    )
    probe_timeout_s: float = Field(
        0.15, gt=0, description="Wait for a direct probe's ack before indirect probes."
    )
    indirect_probe_timeout_s: float = Field(
        0.35, gt=0, description="Wait for an indirect probe through k peers."
    )
    suspicion_s: float = Field(
        0.6, gt=0, description="Base time a suspect has to refute before dead (scaled by log N)."
    )
    dead_reap_s: float = Field(
        300.0, gt=0, description="How long a dead or left member stays in the view."
    )
    mdns_s: float = Field(3.0, gt=0, description="One zeroconf registration or query.")
    sync_s: float = Field(
        300.0,
        gt=0,
        description="One whole sync of one category from one peer (SHOAL_SYNC_TIMEOUT).",
    )
    sync_piece_s: float = Field(
        60.0, gt=0, description="One piece (range request) of a file transfer."
    )
    ssh_connect_s: float = Field(10.0, gt=0, description="Opening an SSH connection for rsync.")
    sqlite_busy_s: float = Field(
        5.0, gt=0, description="SQLite busy timeout for any database of the node."
    )
    wal_op_s: float = Field(
        30.0, gt=0, description="One WAL batch (append, commit) or read before it fails."
    )
    wal_open_s: float = Field(
        120.0, gt=0, description="Opening the WAL, including the quick check of the whole file."
    )
    health_check_s: float = Field(
        5.0, gt=0, description="One health check before it counts as hung."
    )
    gpu_read_s: float = Field(
        2.0,
        gt=0,
        description="One read of the owned GPUs' fault sources (NVML); past it they count as "
        "unreadable, a fault.",
    )
    gpu_selftest_s: float = Field(
        120.0,
        gt=0,
        description="A quarantined node's GPU self-test (dcgmi diag -r 1, or the matmul).",
    )
    breaker_recovery_s: float = Field(
        60.0, gt=0, description="Circuit breaker OPEN time before half-open probes."
    )
    breaker_probe_s: float = Field(
        30.0, gt=0, description="A half-open probe that never reports is failed after this."
    )
    heartbeat_interval_s: float = Field(0.15, gt=0, description="Coordinator heartbeat period.")
    lease_s: float = Field(
        0.75, gt=0, description="Coordinator lease; held only while a majority acked within it."
    )
    election_min_s: float = Field(
        0.75, gt=0, description="Lower bound of the randomized election timeout."
    )
    election_max_s: float = Field(
        1.25, gt=0, description="Upper bound of the randomized election timeout."
    )
    collective_s: float = Field(
        10.0,
        gt=0,
        description="A torch.distributed collective or store operation; also bounds how long a "
        "survivor blocked in a collective with a dead peer waits before it re-forms its group.",
    )
    quorum_s: float = Field(60.0, gt=0, description="Forming a process group from a new plan.")
    watchdog_s: float = Field(
        120.0, gt=0, description="systemd watchdog (WatchdogSec) for the event loop."
    )
    shutdown_s: float = Field(
        8.0, gt=0, description="Graceful stop on SIGTERM: leave, stop loops, close the WAL."
    )
    auth_skew_s: float = Field(
        300.0, gt=0, description="Accepted clock difference of a signed request's timestamp."
    )

    @property
    def detection_s(self) -> float:
        """Worst-case time from a crash to `dead` at every peer (probe + indirect + suspicion)."""
        return (
            self.probe_interval_s
            + self.probe_timeout_s
            + self.indirect_probe_timeout_s
            + self.suspicion_s * 3
        )

    @model_validator(mode="after")
    def _ordered(self) -> Timeouts:
        if self.election_min_s > self.election_max_s:
            raise ValueError(
                f"election_min_s ({self.election_min_s}) must not exceed "
                f"election_max_s ({self.election_max_s})"
            )
        if self.probe_timeout_s >= self.probe_interval_s * 4:
            raise ValueError("probe_timeout_s must be shorter than four probe intervals")
        chain = [
            ("detection", self.detection_s),
            ("collective_s", self.collective_s),
            ("quorum_s", self.quorum_s),
            ("watchdog_s", self.watchdog_s),
        ]
        for (low_name, low), (high_name, high) in itertools.pairwise(chain):
            if not low < high:
                raise ValueError(
                    f"timeouts must satisfy detection < collective_s < quorum_s < watchdog_s; "
                    f"{low_name}={low:g} is not below {high_name}={high:g}"
                )
        return self
