"""Fetch one path from shoal daemons once, signed, from a harness host: one JSON line per target.

usage: netns_fetch.py --secret-file FILE [--timeout-s S] PATH ADDRESS:PORT ...

Prints `{"target": "ADDRESS:PORT", "status": N, "text": BODY}`, or `"error"` instead of
`"status"` and `"text"` when the daemon did not answer within the timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import aiohttp

from config import read_secret_file, signed_headers

FETCH_NODE_ID = "cli-netns-fetch"


async def _fetch(
    session: aiohttp.ClientSession, secret: bytes, path: str, target: str
) -> dict[str, object]:
    headers = signed_headers(secret, FETCH_NODE_ID, "GET", path)
    try:
        async with session.get(f"http://{target}{path}", headers=headers) as response:
            return {"target": target, "status": response.status, "text": await response.text()}
    except (aiohttp.ClientError, TimeoutError) as exc:
        return {"target": target, "error": f"{type(exc).__name__}: {exc}"}


async def _main(args: argparse.Namespace) -> None:
    secret = read_secret_file(Path(args.secret_file))
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        answers = await asyncio.gather(
            *(_fetch(session, secret, args.path, target) for target in args.targets)
        )
    for answer in answers:
        print(json.dumps(answer), flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("path")
    parser.add_argument("targets", nargs="+", help="ADDRESS:PORT of a daemon")
    asyncio.run(_main(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
