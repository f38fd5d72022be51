"""A 3-node loopback cluster of real, signed, elected daemons in this event loop; every job
still running at the end is killed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from node.daemon import NodeDaemon
from tests.node.daemons import FAST_ELECTION, test_settings
from tests.node.jobs.helpers import JobClient, signed_session, write_secret

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


async def agreed(clients: dict[str, JobClient]) -> None:
    """Until every node has the same coordinator and plan, sees 3 alive members, and that
    plan ranks all three for training (a first plan made before the last node joined may
    rank two)."""
    deadline = time.monotonic() + 60
    seen: list[Any] = []
    while time.monotonic() < deadline:
        seen = [(await c.call("GET", "/v1/status"))[1] for c in clients.values()]
        fences = {(s["coordinator"], s["term"], s["plan_version"]) for s in seen}
        alive = {s["members"]["alive"] for s in seen}
        if len(fences) == 1 and None not in next(iter(fences)) and alive == {3}:
            _, plan = await next(iter(clients.values())).call("GET", "/v1/plan")
            if len(plan["plan"]["training_ranks"]) == len(NAMES):
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the cluster did not agree on a plan: {seen}")
