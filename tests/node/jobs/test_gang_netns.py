"""A gang of 3 across network-namespace hosts: `shoal serve` daemons with the cluster secret
and an inventory; a client on a fourth host starts the gang through a non-coordinator."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NetnsClusterFactory
from tests.node.election_netns_swarm import START_S, converged, coordinator_of, start_voters

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[3]
CLIENT = Path(__file__).with_name("gang_netns_client.py")
DAEMONS = 3
REPORT = (
    "import os\n"
    "keys = ['SHOAL_JOB_ID', 'SHOAL_NODE_RANK', 'SHOAL_NODES_NUM', 'MASTER_ADDR', 'MASTER_PORT']\n"
    "print(' '.join(os.environ[k] for k in keys), flush=True)\n"
)
RANK_ONE_FAILS = (
    "import os, sys, time\n"
    "if os.environ['SHOAL_NODE_RANK'] == '1':\n"
    "    time.sleep(0.5); sys.exit(3)\n"
    "time.sleep(120)\n"
)


@pytest.mark.timeout(300)
def test_gang_of_three_on_netns_hosts(netns_cluster: NetnsClusterFactory) -> None:
    cluster = netns_cluster(DAEMONS + 1)
    swarm, watch = start_voters(cluster, DAEMONS)
    watch.wait(
        converged(swarm.names),
        since=0.0,
        timeout_s=START_S,
        hold_s=0.5,
        message="a coordinator and one plan for all 3",
    )
    leader, _ = coordinator_of(watch.matched, swarm.names) or ("?", -1)
    receiver = swarm.host(swarm.others(leader)[0])
    addresses = {h.name: h.address for h in swarm.hosts}

    def gang(job: dict[str, Any]) -> dict[str, Any]:
        argv = [
            sys.executable, str(CLIENT),
            "--secret-file", str(swarm.secret_file),
            "--job", json.dumps(job),
            receiver.endpoint,
        ]  # fmt: skip
        done = swarm.probe_host.run(argv, timeout_s=150, env={"PYTHONPATH": str(ROOT)})
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    ok = gang({"job_id": "g-ok", "argv": [sys.executable, "-c", REPORT], "nodes": 3})
    assert ok["start"][0] == 201, ok["start"]
    ended = ok["ended"]
    assert ended["state"] == "succeeded", ended
    members = ended["gang"]["members"]
    assert sorted(m["node"] for m in members) == sorted(swarm.names)
    fields = {rank: text.split() for rank, text in ok["logs"].items()}
    assert sorted(f[1] for f in fields.values()) == ["0", "1", "2"]
    assert all(f[0] == "g-ok" and f[2] == "3" for f in fields.values())
    masters = {(f[3], f[4]) for f in fields.values()}
    assert len(masters) == 1, masters
    rank0 = next(m for m in members if m["rank"] == 0)
    assert masters.pop()[0] == addresses[rank0["node"]], "MASTER_ADDR is rank 0's address"

    bad = gang({"job_id": "g-bad", "argv": [sys.executable, "-c", RANK_ONE_FAILS], "nodes": 3})
    ended = bad["ended"]
    assert ended["state"] == "failed", ended
    assert ended["exit_code"] == 3
    states = {m["rank"]: m["state"] for m in ended["gang"]["members"]}
    assert states == {0: "killed", 1: "failed", 2: "killed"}
