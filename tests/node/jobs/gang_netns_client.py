"""Start a gang job through one daemon and report it, from a harness host.

usage: gang_netns_client.py --secret-file FILE --job JSON ADDRESS:PORT

POSTs the job (signed) to ADDRESS:PORT, waits for it to end, then prints one JSON object:
`{"start": [STATUS, BODY], "ended": RECORD, "logs": {RANK: STDOUT}}` (each member's stdout read
from the member's own node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp

from config import read_secret_file, signing_middleware

WAIT_S = 90.0


async def run(secret: bytes, job: dict[str, Any], target: str) -> dict[str, Any]:
    base = f"http://{target}"
    middlewares = (signing_middleware(secret, "cli-gang"),)
    async with aiohttp.ClientSession(middlewares=middlewares) as session:
        async with session.post(f"{base}/v1/jobs", json=job) as response:
            start = [response.status, await response.json()]
        job_id = start[1]["job_id"]
        url = f"{base}/v1/jobs/{job_id}/wait?timeout_s={WAIT_S:g}"
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=WAIT_S + 10)) as response:
            ended = await response.json()
        logs = {}
        for member in (ended.get("gang") or {}).get("members", []):
            log_url = f"{member['url']}/v1/jobs/{member['job_id']}/logs"
            async with session.get(log_url) as response:
                logs[str(member["rank"])] = (await response.read()).decode()
        return {"start": start, "ended": ended, "logs": logs}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("target")
    args = parser.parse_args(argv)
    secret = read_secret_file(args.secret_file)
    print(json.dumps(asyncio.run(run(secret, json.loads(args.job), args.target))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
