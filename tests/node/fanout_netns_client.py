"""The client of the netns fan-out test, run on a host of its own: waits until every daemon
sees all the others, asks every puller to sync `models` from the origin at once, then prints
one JSON line: each puller's run and every node's `fanout` tallies.

Usage: python tests/node/fanout_netns_client.py ORIGIN_URL PULLER_URL... [--timeout-s S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout


async def _json(session: ClientSession, method: str, url: str, **kw: Any) -> Any:
    async with session.request(method, url, **kw) as answer:
        if answer.status != 200:
            raise RuntimeError(f"{method} {url}: HTTP {answer.status}: {await answer.text()}")
        return await answer.json()


async def main(origin: str, pullers: list[str], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    nodes = [origin, *pullers]
    async with ClientSession(timeout=ClientTimeout(total=timeout_s)) as session:
        for url in nodes:
            while True:
                try:
                    status = await _json(session, "GET", f"{url}/v1/sync/status")
                    if len(status["peers"]) >= len(pullers):
                        break
                except (ClientError, OSError, RuntimeError):
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{url} never saw {len(pullers)} peers")
                await asyncio.sleep(0.2)
        started = time.monotonic()
        body = {"categories": ["models"], "from": "origin"}
        runs = await asyncio.gather(
            *(_json(session, "POST", f"{url}/v1/sync/run", json=body) for url in pullers)
        )
        took_s = time.monotonic() - started
        fanout = {
            url: (await _json(session, "GET", f"{url}/v1/sync/status"))["fanout"] for url in nodes
        }
    return {"runs": runs, "fanout": fanout, "took_s": took_s}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("origin")
    parser.add_argument("pullers", nargs="+")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.origin, args.pullers, args.timeout_s))))
