"""Cluster lock hand-over on a loopback cluster of three voter daemons (shrunk election timing).

Prints one JSON document: the time from a release to the next waiter's grant (p50/p99/max over
`--handovers`), and the time from a holder's last renewal to the next waiter's grant when the
holder dies (expected: about ttl_s), over `--deaths` rounds.
Usage: python bench/runs_bench.py [--handovers 30] [--deaths 3] [--ttl 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.node.runs.cluster import post, running  # noqa: E402


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


async def wait_grant(url: str, holder: str, ttl_s: float) -> dict[str, Any]:
    while True:
        body = {"holder": holder, "ttl_s": ttl_s, "wait": True, "wait_s": 10}
        status, answer = await post(f"{url}/acquire", body)
        if status == 200 and answer["granted"]:
            return dict(answer)


async def bench(handovers: int, deaths: int, ttl_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with running(Path(tmp)) as cluster:
            urls = [f"{u}/v1/locks/bench" for u in cluster.urls]
            handover: list[float] = []
            first = await wait_grant(urls[0], "h0", 30)
            for index in range(1, handovers + 1):
                waiter = asyncio.create_task(wait_grant(urls[index % 3], f"h{index}", 30))
                await asyncio.sleep(0.1)
                released = time.monotonic()
                await post(
                    f"{urls[0]}/release", {"holder": f"h{index - 1}", "fence": first["fence"]}
                )
                first = await waiter
                handover.append(time.monotonic() - released)
            await post(f"{urls[0]}/release", {"holder": f"h{handovers}", "fence": first["fence"]})
            dead: list[float] = []
            for index in range(deaths):
                holder = await wait_grant(urls[0], f"dead{index}", ttl_s)
                last_renewal = time.monotonic()
                successor = await wait_grant(urls[1], f"next{index}", ttl_s)
                dead.append(time.monotonic() - last_renewal)
                await post(
                    f"{urls[1]}/release", {"holder": f"next{index}", "fence": successor["fence"]}
                )
                del holder
    return {
        "release_to_next_grant": summary(handover),
        "dead_holder_to_next_grant": {**summary(dead), "ttl_s": ttl_s},
        "target_release_handover_under_1s": max(handover) < 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--handovers", type=int, default=30)
    parser.add_argument("--deaths", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=2.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(bench(args.handovers, args.deaths, args.ttl)), indent=2))


if __name__ == "__main__":
    main()
