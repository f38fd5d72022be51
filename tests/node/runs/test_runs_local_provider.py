"""A run whose nodes come from the `local` provider: the coordinator starts the stopped local
node before the job (the job sees it answering), stops it after the results are collected, and
leaves it running with keep-alive."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import node.assembly
from node.providers import RUNNING, STOPPED, GPUQuery, LocalProvider
from node.runs import ProviderNodes
from tests.node.runs.cluster import post, running
from tests.node.runs.test_runs_cluster import wait_done

PROBE = (
    "import sys, urllib.request\n"
    "try:\n"
    "    up = urllib.request.urlopen(sys.argv[1] + '/v1/health', timeout=5).status == 200\n"
    "except OSError:\n"
    "    up = False\n"
    "open('out.txt', 'w').write('up' if up else 'down')\n"
)


@pytest.mark.timeout(240)
async def test_a_run_starts_and_stops_its_local_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with LocalProvider(tmp_path / "local", capacity=1) as provider:
        handle = await provider.acquire(GPUQuery())
        await provider.stop(handle)
        assert [h.state for h in await provider.list()] == [STOPPED]
        # every daemon of the cluster drives runs through this provider (the seam: the
        # daemon's choice of node starter when it has no inventory)
        monkeypatch.setattr(node.assembly, "StaticNodes", lambda: ProviderNodes(provider))
        async with running(tmp_path / "cluster") as cluster:
            body = {
                "argv": [sys.executable, "-c", PROBE, str(handle.url)],
                "nodes": 1,
                "results": ["out.txt"],
            }
            status, record = await post(f"{cluster.urls[0]}/v1/runs", body)
            assert status == 201, record
            done = await wait_done(cluster, record["run_id"], 120)
            assert done["state"] == "succeeded", done
            assert done["started_nodes"] == [handle.id]
            notes = [line.get("note", "") for line in done["log"]]
            assert f"provider local: {handle.id}: {handle.id} started" in notes
            assert f"provider local: {handle.id}: {handle.id} stopped" in notes
            (upload,) = done["uploaded"]
            stored = next((tmp_path / "cluster").glob(f"*/results/{upload['key']}"))
            assert stored.read_text() == "up"  # the job ran while the local node answered
            assert [h.state for h in await provider.list()] == [STOPPED]

            status, kept = await post(f"{cluster.urls[1]}/v1/runs", {**body, "keep_alive": True})
            assert status == 201, kept
            done = await wait_done(cluster, kept["run_id"], 120)
            assert done["state"] == "succeeded", done
            assert done["started_nodes"] == [handle.id], [x.get("note") for x in done["log"]]
            assert [line.get("note") for line in done["log"]][-1] == "kept alive (--keep-alive)"
            assert [h.state for h in await provider.list()] == [RUNNING]
