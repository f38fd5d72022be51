"""A 3-node loopback cluster of real, signed, elected daemons in this event loop; every job
still running at the end is killed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from node.daemon import NodeDaemon
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.jobs.helpers import JobClient, agreed, signed_session, write_secret

NAMES = ("n1", "n2", "n3")


@contextlib.asynccontextmanager
async def three_nodes(tmp_path: Path) -> AsyncIterator[dict[str, JobClient]]:
    secret = write_secret(tmp_path)
    common: dict[str, Any] = {
        **FAST_ELECTION,
        "voters": NAMES,
        "role": "training",
        "backend": "gloo",
        "secret_file": secret,
    }
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(signed_session())
        first = await stack.enter_async_context(
            NodeDaemon(test_settings(tmp_path, NAMES[0], **common))
        )
        daemons = [first]
        seeds = (f"127.0.0.1:{first.port}",)
        for name in NAMES[1:]:
            daemon = NodeDaemon(test_settings(tmp_path, name, seeds=seeds, **common))
            daemons.append(await stack.enter_async_context(daemon))
        clients = {
            name: JobClient(f"http://127.0.0.1:{d.port}", session)
            for name, d in zip(NAMES, daemons, strict=True)
        }
        await agreed(clients)
        try:
            yield clients
        finally:
            for client in clients.values():
                _, listing = await client.call("GET", "/v1/jobs?state=running")
                for job in listing["jobs"]:
                    await client.call(
                        "POST", f"/v1/jobs/{job['job_id']}/kill", json={"signal": "KILL"}
                    )
            for client in clients.values():
                _, listing = await client.call("GET", "/v1/jobs")
                for job in listing["jobs"]:
                    await client.wait(job["job_id"])
