"""Watch shoal daemons' membership views from a harness host: one JSON line per answer.

usage: netns_probe.py --secret-file FILE [--interval-s S] [--timeout-s S] ADDRESS:PORT ...

Each target is polled on its own (a hung daemon does not slow the others): a signed
GET /v1/peers every interval, printing `{"t": MONOTONIC, "target": "ADDRESS:PORT", "members":
{NODE_ID: [STATE, INCARNATION]}}`, or `"error"` instead of `"members"` when it did not answer.
`t` is time.monotonic() when the answer arrived (one clock for every process of the machine).
Runs until killed. SIGSTOP pauses it (no load on the daemons), SIGCONT resumes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from config import read_secret_file, signing_middleware

PEERS_PATH = "/v1/peers"
PROBE_NODE_ID = "cli-netns-probe"


def _line(target: str, **fields: object) -> None:
    print(json.dumps({"t": time.monotonic(), "target": target, **fields}), flush=True)


Fields = Callable[[Any], dict[str, object]]


def _members(document: Any) -> dict[str, object]:
    return {"members": {m["node_id"]: [m["state"], m["incarnation"]] for m in document["members"]}}


async def _watch(
    session: aiohttp.ClientSession,
    target: str,
    interval_s: float,
    path: str,
    fields: Fields,
) -> None:
    url = f"http://{target}{path}"
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        try:
            async with session.get(url) as response:
                document = await response.json(content_type=None)
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}: {document}")
            _line(target, **fields(document))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            _line(target, error=f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(max(0.0, started + interval_s - loop.time()))


async def _main(args: argparse.Namespace, path: str, fields: Fields) -> None:
    secret = read_secret_file(Path(args.secret_file))
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(
            timeout=timeout,
            connector=connector,
            middlewares=(signing_middleware(secret, PROBE_NODE_ID),),
        ) as session,
        asyncio.TaskGroup() as group,
    ):
        for target in args.targets:
            group.create_task(_watch(session, target, args.interval_s, path, fields))


def run_probe(
    argv: list[str], description: str, path: str, fields: Fields, interval_s: float
) -> int:
    """Parse the probe's flags and poll `path` of every target, printing `fields` of each answer."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--interval-s", type=float, default=interval_s)
    parser.add_argument("--timeout-s", type=float, default=0.5)
    parser.add_argument("targets", nargs="+", help="ADDRESS:PORT of a daemon")
    args = parser.parse_args(argv)
    print("ready", flush=True)
    asyncio.run(_main(args, path, fields))
    return 0


def main(argv: list[str]) -> int:
    return run_probe(argv, __doc__.splitlines()[0], PEERS_PATH, _members, 0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
