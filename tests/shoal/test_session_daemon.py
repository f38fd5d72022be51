"""A script outside any launcher (no torchrun variables): `shoal.training_session()` joins the
group the local daemon's rendezvous gives it, from a directory holding the six decoy modules,
and its reports reach that daemon."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

from node import NodeDaemon
from shoal._daemon import DaemonClient
from tests.cluster.cluster import free_port
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.shoal.test_import_safety import write_decoys

SCRIPT = """
import sys
import shoal
import torch
import torch.distributed as dist

with shoal.training_session(join_timeout_s=60) as session:
    for step in range(5):
        dist.all_reduce(torch.ones(1))
        session.report(step, loss=0.25)
    print("joined", session.rank, session.world_size, session.generation)
ours = [n for n in ("config", "net", "wal", "health", "sync", "node") if n in sys.modules]
assert not ours, f"the session loaded {ours}"
"""


async def test_a_script_joins_through_the_daemons_rendezvous_and_reports_to_it(
    tmp_path: Path,
) -> None:
    settings = test_settings(
        tmp_path,
        "solo",
        **FAST_ELECTION,
        role="training",
        backend="gloo",
        gpus="none",
        master_port=free_port(),
    )
    repo = tmp_path / "repo"
    repo.mkdir()
    write_decoys(repo)
    (repo / "train.py").write_text(textwrap.dedent(SCRIPT))
    async with NodeDaemon(settings) as daemon:
        url = f"http://127.0.0.1:{daemon.port}"
        env = {"SHOAL_DAEMON_URL": url, "PATH": "/usr/bin:/bin", "TORCH_CPP_LOG_LEVEL": "ERROR"}
        run = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(repo / "train.py")],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        joined, rank, world, generation = run.stdout.split()
        assert (joined, rank, world) == ("joined", "0", "1")
        client = DaemonClient(url)
        part = await asyncio.to_thread(client.request, "GET", "/v1/training/node")
        client.close()
    [progress] = part["ranks"]
    assert (progress["rank"], progress["step"], progress["generation"]) == (0, 4, int(generation))
    assert progress["scalars"] == {"loss": 0.25}
