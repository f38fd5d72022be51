"""`results: {backend: local, node: NAME}`: a run's results land in the named node's directory
(that node fetches each file from its member when the coordinator asks), never on the
coordinator's host; any other node refuses to be the store."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.node.runs.cluster import post, running
from tests.node.runs.test_runs_cluster import run_body, wait_done

STORE = "v3"


async def test_results_are_stored_on_the_named_node(tmp_path: Path) -> None:
    marker = tmp_path / "starts.txt"
    async with running(tmp_path, **{"results.node": STORE}) as cluster:
        coordinator = await cluster.elected()
        if coordinator == STORE:  # the point is a store on another node than the coordinator
            await cluster.stop(STORE)
            coordinator = await cluster.elected()
            await cluster.start(STORE)
        via = cluster.urls[0]
        status, record = await post(f"{via}/v1/runs", run_body(marker, 0.2, "kept"))
        assert status == 201, record
        done = await wait_done(cluster, record["run_id"], 90)
        assert done["state"] == "succeeded", done
        assert len(done["uploaded"]) == 2
        for upload in done["uploaded"]:
            key = upload["key"]
            assert key == f"runs/{done['run_id']}/{upload['node']}/out.txt"
            holders = sorted(p.parts[-6] for p in tmp_path.glob(f"*/results/{key}"))
            assert holders == [STORE], f"{key} stored on {holders}, coordinator {coordinator}"
            content = (tmp_path / STORE / "results" / key).read_bytes()
            assert content == b"result of kept\n"
            assert upload["hash"] == hashlib.sha256(content).hexdigest()

        fetch = {"key": "runs/r1/v1/out.txt", "node": "v1", "job_id": "r1.0", "path": "out.txt"}
        not_store = next(n for n in cluster.ports if n != STORE)
        url = f"http://127.0.0.1:{cluster.ports[not_store]}/v1/results/fetch"
        status, answer = await post(url, fetch)
        assert status == 409
        assert answer["error"] == "not_results_node"
        store_url = f"http://127.0.0.1:{cluster.ports[STORE]}/v1/results/fetch"
        for bad in (
            {**fetch, "key": "runs/r1/v1/../../../etc/passwd"},
            {**fetch, "key": "runs/r1/v2/out.txt"},
            {**fetch, "job_id": "../x"},
        ):
            status, answer = await post(store_url, bad)
            assert status == 400, (bad, answer)
        status, answer = await post(
            store_url, {**fetch, "node": "nobody", "key": "runs/r1/nobody/out.txt"}
        )
        assert status == 503
        assert answer["error"] == "node_unknown"
