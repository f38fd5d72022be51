"""Watch shoal daemons' election from a harness host: one JSON line per answer.

usage: election_netns_probe.py --secret-file FILE [--interval-s S] [--timeout-s S] ADDRESS:PORT ...

Each target is polled on its own (a hung daemon does not slow the others): a signed GET /v1/plan
every interval, printing `{"t": MONOTONIC, "target": "ADDRESS:PORT", "node", "term",
"coordinator", "lease_valid", "plan": [TERM, VERSION] | null, "ranks": [NODE, ...] | null,
"nodes": [NODE, ...] | null}` (`nodes`: every node the plan gives a role), or `"error"` instead
when it did not answer. `t` is time.monotonic()
when the answer arrived (one clock for every process of the machine). Runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from config import read_secret_file, signed_headers

PLAN_PATH = "/v1/plan"
PROBE_NODE_ID = "election-probe"


def _line(target: str, **fields: object) -> None:
    print(json.dumps({"t": time.monotonic(), "target": target, **fields}), flush=True)


def _fields(document: dict[str, Any]) -> dict[str, object]:
    plan = document.get("plan")
    return {
        "node": document["node"],
        "term": document["term"],
        "coordinator": document["coordinator"],
        "lease_valid": document["lease_valid"],
        "plan": None if plan is None else [plan["term"], plan["version"]],
        "ranks": None if plan is None else plan["training_ranks"],
        "nodes": None if plan is None else sorted(plan["roles"]),
    }


async def _watch(
    session: aiohttp.ClientSession, secret: bytes, target: str, interval_s: float
) -> None:
    url = f"http://{target}{PLAN_PATH}"
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        headers = signed_headers(secret, PROBE_NODE_ID, "GET", PLAN_PATH)
        try:
            async with session.get(url, headers=headers) as response:
                document = await response.json(content_type=None)
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}: {document}")
            _line(target, **_fields(document))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            _line(target, error=f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(max(0.0, started + interval_s - loop.time()))


async def _main(args: argparse.Namespace) -> None:
    secret = read_secret_file(Path(args.secret_file))
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        asyncio.TaskGroup() as group,
    ):
        for target in args.targets:
            group.create_task(_watch(session, secret, target, args.interval_s))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--interval-s", type=float, default=0.05)
    parser.add_argument("--timeout-s", type=float, default=0.5)
    parser.add_argument("targets", nargs="+", help="ADDRESS:PORT of a daemon")
    args = parser.parse_args(argv)
    print("ready", flush=True)
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
