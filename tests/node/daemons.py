"""Settings for in-process test daemons: loopback, port 0, no mDNS, shrunk timing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from config import NodeSettings, load_settings

FAST_MEMBERSHIP = {
    "timeouts.probe_interval_s": 0.1,
    "timeouts.probe_timeout_s": 0.05,
    "timeouts.indirect_probe_timeout_s": 0.1,
    "timeouts.suspicion_s": 0.3,
}
FAST_ELECTION = {
    "timeouts.heartbeat_interval_s": 0.05,
    "timeouts.lease_s": 0.4,
    "timeouts.election_min_s": 0.3,
    "timeouts.election_max_s": 0.6,
}


def test_settings(tmp_path: Path, name: str, **flags: Any) -> NodeSettings:
    """A node `name` with its data dir under `tmp_path`; `flags` override any setting."""
    base = {
        "data_dir": tmp_path / name,
        "node_id": name,
        "port": 0,
        "mdns": False,
        "cluster_name": f"t{os.getpid()}",
        **FAST_MEMBERSHIP,
    }
    return load_settings(env={}, flags={**base, **flags}).settings


test_settings.__test__ = False  # type: ignore[attr-defined]
