"""One contending lock client on a harness host: takes `cluster_lock` again and again, holding
it a random while, and logs what it believes (see lock_history.py for the events).

usage: locks_netns_client.py --secret-file FILE --log FILE --name NAME [--ttl-s S]
       [--hold-max-s S] [--long-share P] [--seed N] ADDRESS:PORT ...

A share P of the holds lasts one to two ttl_s (so it needs renewals, and spans failovers);
the others up to --hold-max-s.

Runs until killed. Every line is flushed as it is written, so a SIGKILL loses none.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import IO, Any

from config import read_secret_file
from node.errors import LockError
from node.locks import cluster_lock

REQUEST_TIMEOUT_S = 1.0
"""Short, so a client leaves a cut-off node for the next one quickly."""


def _writer(path: Path) -> tuple[IO[str], Any]:
    out = path.open("a", encoding="utf-8")

    def note(event: str, **fields: object) -> None:
        out.write(json.dumps({"e": event, "t": time.monotonic(), **fields}) + "\n")
        out.flush()

    return out, note


async def contend(args: argparse.Namespace, secret: bytes) -> None:
    rng = random.Random(args.seed)
    urls = [f"http://{target}" for target in args.targets]
    out, note = _writer(args.log)
    note("boot", pid=os.getpid())
    turn = 0

    def queued(holder: str, position: int) -> None:
        note("queued", holder=holder, position=position)

    try:
        while True:
            turn += 1
            holder = f"{args.name}.{os.getpid()}.{turn}"
            note("ask", holder=holder)
            try:
                async with cluster_lock(
                    "netns",
                    holder=holder,
                    ttl_s=args.ttl_s,
                    urls=urls,
                    secret=secret,
                    wait_s=1.0,
                    request_timeout_s=REQUEST_TIMEOUT_S,
                    on_position=functools.partial(queued, holder),
                ) as fence:
                    note("start", holder=holder, fence=fence.to_list())
                    try:
                        long = rng.random() < args.long_share
                        await asyncio.sleep(
                            rng.uniform(args.ttl_s, 2 * args.ttl_s)  # outlives a lease
                            if long
                            else rng.uniform(0.02, args.hold_max_s)
                        )
                    finally:
                        note("end", holder=holder)
                note("released", holder=holder)
            except LockError as exc:  # lost, unavailable, or refused
                note("lost", holder=holder, reason=str(exc))
            await asyncio.sleep(rng.uniform(0.0, 0.1))
    finally:
        out.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--ttl-s", type=float, default=3.0)
    parser.add_argument("--hold-max-s", type=float, default=1.0)
    parser.add_argument("--long-share", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    asyncio.run(contend(args, read_secret_file(args.secret_file)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
