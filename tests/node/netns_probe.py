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
from pathlib import Path

import aiohttp

from config import read_secret_file, signed_headers

PEERS_PATH = "/v1/peers"
PROBE_NODE_ID = "netns-probe"


def _line(target: str, **fields: object) -> None:
    print(json.dumps({"t": time.monotonic(), "target": target, **fields}), flush=True)


async def _watch(
    session: aiohttp.ClientSession, secret: bytes, target: str, interval_s: float
) -> None:
    url = f"http://{target}{PEERS_PATH}"
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        headers = signed_headers(secret, PROBE_NODE_ID, "GET", PEERS_PATH)
        try:
            async with session.get(url, headers=headers) as response:
                document = await response.json(content_type=None)
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}: {document}")
            members = {m["node_id"]: [m["state"], m["incarnation"]] for m in document["members"]}
            _line(target, members=members)
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
    parser.add_argument("--interval-s", type=float, default=0.1)
    parser.add_argument("--timeout-s", type=float, default=0.5)
    parser.add_argument("targets", nargs="+", help="ADDRESS:PORT of a daemon")
    args = parser.parse_args(argv)
    print("ready", flush=True)
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
