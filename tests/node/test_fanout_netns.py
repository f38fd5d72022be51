"""Fan-out across hosts: `shoal serve` on 1 origin and 4 puller hosts in network namespaces,
every node under an upload cap, the 4 pulling a 64 MiB checkpoint at once (asked by a client
on a sixth host). Every copy verifies, and the origin sends well under 4 copies because the
pullers fetch pieces from each other."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from tests.cluster import Host, NetnsClusterFactory

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("fanout_netns_client.py")
SIZE = 64 << 20
PULLERS = 4
UPLOAD_CAP = 40e6
RUN_S = 240.0
"""Liveness bound for start-up, membership and the whole fan-out (a few seconds measured)."""
CONFIG = f"sync_interval_s: 0\nsync_upload_limit_bytes_s: {UPLOAD_CAP}\n"


def _digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _url(host: Host) -> str:
    return f"http://{host.address}:{host.port}"


def test_four_pullers_on_netns_hosts_share_pieces(netns_cluster: NetnsClusterFactory) -> None:
    cluster = netns_cluster(PULLERS + 2)
    origin, pullers, client = cluster.hosts[0], cluster.hosts[1 : PULLERS + 1], cluster.hosts[-1]
    config = cluster.base_dir / "node.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    checkpoint = origin.data_dir / "models" / "run1" / "step-9.pt"
    checkpoint.parent.mkdir(parents=True)
    with checkpoint.open("wb") as file:
        for _ in range(SIZE >> 20):
            file.write(os.urandom(1 << 20))
    expected = _digest(checkpoint)
    for host in (origin, *pullers):
        name = "origin" if host is origin else host.name
        argv = [
            sys.executable, "-m", "node", "serve",
            "--bind", host.address, "--port", str(host.port), "--insecure", "--no-mdns",
            "--data-dir", str(host.data_dir), "--node-id", name, "--config", str(config),
        ]  # fmt: skip
        if host is not origin:
            argv += ["--seed", origin.endpoint]
        host.spawn(argv, cwd=ROOT, name="shoal")
    argv = [sys.executable, str(CLIENT), _url(origin), *map(_url, pullers)]
    answer = client.run(
        [*argv, "--timeout-s", str(RUN_S)],
        timeout_s=RUN_S + 30,
        env={"PYTHONPATH": str(ROOT)},
    )
    result = json.loads(answer.stdout.strip().splitlines()[-1])
    for run in result["runs"]:
        assert run["files"]["models"]["errors"] == []
        assert run["files"]["models"]["files_transferred"] == 1
    for host in pullers:
        assert _digest(host.data_dir / "models" / "run1" / "step-9.pt") == expected
    egress = result["fanout"][_url(origin)]["models"]["served_bytes"]
    assert SIZE <= egress <= 2 * SIZE, f"the origin sent {egress / SIZE:.2f} copies"
    from_peers = sum(result["fanout"][_url(h)]["models"]["from_peers_bytes"] for h in pullers)
    assert from_peers >= (PULLERS - 2) * SIZE
    print(f"fan-out of {SIZE} bytes to {PULLERS}: {result['took_s']:.2f} s, egress {egress}")
