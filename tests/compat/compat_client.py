"""The client of the mixed-release test, run on a harness host of its own with the current tree.

usage: compat_client.py --secret-file FILE --nodes JSON --old ID,... --gang-via ID,...
       [--timeout-s S]

`--nodes` maps node id to URL. Waits until every node shows every node alive, then reads each
node's X-Shoal-Version and status, ingests games on the first old and the first new node, has
each of the two pull games and `models` files from the other, and runs a gang job over every
node through each node of `--gang-via` in turn (the node a client asks drives the gang). Prints
one JSON object: `views`, `versions`, `records`, `syncs`, `gangs` (per node asked: `start`,
`ended`, `logs`).
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

from config import HEADER_VERSION, read_secret_file, signing_middleware

GANG_WAIT_S = 60.0
REPORT = (
    "import os\n"
    "keys = ['SHOAL_JOB_ID', 'SHOAL_NODE_RANK', 'SHOAL_NODES_NUM', 'MASTER_ADDR', 'MASTER_PORT']\n"
    "print(' '.join(os.environ[k] for k in keys), flush=True)\n"
)


def _game(game_id: str, index: int) -> dict[str, Any]:
    return {
        "game_id": game_id,
        "created_at": 1000.0 + index,
        "board_type": "hex8",
        "num_players": 2,
        "winner": index % 2,
        "moves": ["a1", "b2"],
    }


async def _json(session: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> Any:
    async with session.request(method, url, **kw) as answer:
        if answer.status not in (200, 201):
            raise RuntimeError(f"{method} {url}: HTTP {answer.status}: {await answer.text()}")
        return await answer.json()


async def _views(
    session: aiohttp.ClientSession, nodes: dict[str, str], old: list[str], deadline: float
) -> dict[str, dict[str, Any]]:
    """Every node's view once each shows every node alive, a new node with every member's meta
    (its release); RuntimeError at the deadline."""
    views: dict[str, dict[str, Any]] = {}
    while True:
        for node, url in nodes.items():
            try:
                members = (await _json(session, "GET", f"{url}/v1/peers"))["members"]
            except (aiohttp.ClientError, OSError, RuntimeError) as exc:
                views[node] = {"error": str(exc)}
                continue
            views[node] = {
                m["node_id"]: [
                    m["state"],
                    m.get("version"),
                    m.get("protocol"),
                    m["meta"].get("protocol"),
                ]
                for m in members
            }
        alive = all(
            all(views[node].get(other, [None])[0] == "alive" for other in nodes) for node in nodes
        )
        if alive and all(
            views[node][other][1] is not None
            for node in nodes
            if node not in old
            for other in nodes
        ):
            return views
        if time.monotonic() > deadline:
            raise RuntimeError(f"membership did not converge: {views}")
        await asyncio.sleep(0.2)


async def _keys(session: aiohttp.ClientSession, url: str, keys: list[str]) -> list[str]:
    params = [("key", key) for key in keys]
    found = await _json(session, "GET", f"{url}/v1/records/games/get", params=params)
    return sorted(record["game_id"] for record in found["records"])


async def _gang(
    session: aiohttp.ClientSession, nodes: dict[str, str], via: str, size: int
) -> dict[str, Any]:
    """A gang job of `size` started through node `via`: its start answer, end and logs."""
    job = {"job_id": f"compat-gang-{via}", "argv": [sys.executable, "-c", REPORT], "nodes": size}
    async with session.post(f"{nodes[via]}/v1/jobs", json=job) as answer:
        start = [answer.status, await answer.json()]
    url = f"{nodes[via]}/v1/jobs/{job['job_id']}/wait?timeout_s={GANG_WAIT_S:g}"
    timeout = aiohttp.ClientTimeout(total=GANG_WAIT_S + 10)
    async with session.get(url, timeout=timeout) as answer:
        ended = await answer.json()
    logs = {}
    for member in (ended.get("gang") or {}).get("members", []):
        log_url = f"{member['url']}/v1/jobs/{member['job_id']}/logs"
        async with session.get(log_url) as answer:
            logs[str(member["rank"])] = (await answer.read()).decode()
    return {"start": start, "ended": ended, "logs": logs}


async def run(
    secret: bytes, nodes: dict[str, str], old: list[str], gang_via: list[str], timeout_s: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    new = [node for node in nodes if node not in old]
    middlewares = (signing_middleware(secret, "cli-compat"),)
    async with aiohttp.ClientSession(middlewares=middlewares) as session:
        result: dict[str, Any] = {"views": await _views(session, nodes, old, deadline)}
        versions = {}
        for node, url in nodes.items():
            async with session.get(f"{url}/v1/status") as answer:
                status = await answer.json()
                versions[node] = {
                    "header": answer.headers.get(HEADER_VERSION),
                    "release": status.get("release"),
                    "version": status.get("version"),
                    "protocol": status.get("protocol"),
                }
        result["versions"] = versions
        pair = (old[0], new[0])
        keys = {node: [f"{node}-g{i}" for i in range(5)] for node in pair}
        for node in pair:
            games = [_game(key, i) for i, key in enumerate(keys[node])]
            await _json(session, "POST", f"{nodes[node]}/v1/records/games", json=games)
        syncs = {}
        for puller, source in (pair, pair[::-1]):
            body = {"categories": ["games", "models"], "from": source}
            syncs[puller] = await _json(session, "POST", f"{nodes[puller]}/v1/sync/run", json=body)
        result["syncs"] = syncs
        wanted = sorted(keys[pair[0]] + keys[pair[1]])
        result["records"] = {node: await _keys(session, nodes[node], wanted) for node in pair}
        result["gangs"] = {via: await _gang(session, nodes, via, len(nodes)) for via in gang_via}
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--old", required=True)
    parser.add_argument("--gang-via", required=True)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    secret = read_secret_file(args.secret_file)
    nodes = json.loads(args.nodes)
    found = asyncio.run(
        run(secret, nodes, args.old.split(","), args.gang_via.split(","), args.timeout_s)
    )
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
