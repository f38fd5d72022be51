"""The weights plane of one netns host for tests/node/rl/test_publish_netns.py: a WeightsService
with a fixed role plan (t trains, a and b generate), served on the host's address.

argv: NODE PORT ADDRESSES_JSON ({node: address}); prints "serving" once it listens."""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web
from prometheus_client import CollectorRegistry

from config import Role
from node.plan import GroupSpec, RolePlan
from node.rl.routes import WeightsRoutes
from node.rl.service import WeightsService

MASTER_PORT = 29500


async def main() -> None:
    node, port, addresses = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    plan = RolePlan(
        term=1,
        version=1,
        roles={"t": Role.TRAINING, "a": Role.INFERENCE, "b": Role.SELFPLAY},
        training_ranks=("t",),
        group=GroupSpec(addresses["t"], MASTER_PORT, 1, "gloo"),
        weights_generation=1,
    )

    def url_of(member: str) -> str | None:
        address = addresses.get(member)
        return None if address is None else f"http://{address}:{port}"

    service = WeightsService(node, lambda: plan, url_of, registry=CollectorRegistry())
    app = web.Application()
    app.add_routes(WeightsRoutes(service).routes())
    app.router.add_get("/v1/rendezvous", WeightsRoutes(service).rendezvous)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, addresses[node], port).start()
    print("serving", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
