"""A process that asks for one named actor `count` times at once (threads), calls it once and
prints the (name, incarnation, address) of every handle it got, as JSON."""

from __future__ import annotations

import concurrent.futures as cf
import json
import sys
from pathlib import Path

from node.tasks.shoal import ShoalContext
from tests.node.tasks.contract import InitCounting


def main(url: str, config: str, name: str, count: int, marker: str) -> None:
    root = str(Path(__file__).resolve().parents[3])
    context = ShoalContext(url, config_file=config, env={"PYTHONPATH": root}, start_workers=False)

    def claim(_: int) -> tuple[str | None, int, str]:
        handle = context.create_actor(InitCounting, marker, name=name, get_if_exists=True)
        return handle.name, handle.incarnation, handle.address

    with cf.ThreadPoolExecutor(16) as pool:
        seen = list(pool.map(claim, range(count)))
    handle = context.create_actor(InitCounting, marker, name=name, get_if_exists=True)
    calls = context.get(handle.incr.remote(), timeout_s=60)
    print(json.dumps({"handles": sorted(set(seen)), "count": len(seen), "calls": calls}))
    context.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
