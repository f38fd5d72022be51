"""The client of the rolling-upgrade test, run on a harness host of its own with the current tree.

usage: rolling_client.py --secret-file FILE --nodes JSON --dir DIR --python PATH
       [--rate-hz R] [--exit-code N] [--timeout-s S]

`--nodes` maps node id to URL. Waits until every node names one coordinator and sees every node
alive, then, until the file `DIR/stop` appears: samples every node's /v1/status every
SAMPLE_INTERVAL_S and ingests one game at a time at `--rate-hz`, to the nodes in turn, keeping
the key of every game a node acknowledged. Once the samples and ingest run it starts a gang job
over every node through the first node (each member waits for `DIR/release`, then exits
`--exit-code`) and writes `DIR/ready.json`. After `stop`: writes `DIR/release`, waits for the
gang's end through the job API, has every node pull games from the others until each holds every
acknowledged key, and writes `DIR/result.json`: `samples`, `acked`, `refused`, `gang` (`start`,
`ended`), `missing` (per node, the acknowledged keys it lacks at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from config import read_secret_file, signing_middleware

SAMPLE_INTERVAL_S = 0.25
SAMPLE_TIMEOUT_S = 4.0
POST_TIMEOUT_S = 5.0
CONVERGE_S = 120.0
GANG_START_S = 60.0
GANG_END_S = 120.0
SYNC_S = 120.0
GANG_ID = "rolling-gang"
KEYS_PER_GET = 200
MEMBER = (
    "import os, sys, time\n"
    "release, limit, code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])\n"
    "deadline = time.monotonic() + limit\n"
    "while not os.path.exists(release):\n"
    "    if time.monotonic() > deadline:\n"
    "        sys.exit(3)\n"
    "    time.sleep(0.1)\n"
    "sys.exit(code)\n"
)
"""A gang member: waits for the release file (at most `limit` seconds, then exits 3), then exits
with the chosen code."""
MEMBER_LIMIT_S = 900.0


def _game(key: str, index: int) -> dict[str, Any]:
    return {
        "game_id": key,
        "created_at": 1000.0 + index,
        "board_type": "hex8",
        "num_players": 2,
        "winner": index % 2,
        "moves": ["a1", "b2"],
    }


async def _json(
    session: aiohttp.ClientSession, method: str, url: str, timeout_s: float = 10.0, **kw: Any
) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.request(method, url, timeout=timeout, **kw) as answer:
        try:
            return answer.status, await answer.json(content_type=None)
        except ValueError:
            return answer.status, {"text": (await answer.text())[:300]}


async def _status(session: aiohttp.ClientSession, url: str) -> list[Any] | None:
    """[term, coordinator, release] of a node's /v1/status, or None when it did not answer."""
    try:
        code, body = await _json(session, "GET", f"{url}/v1/status", SAMPLE_TIMEOUT_S)
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    if code != 200 or not isinstance(body, dict):
        return None
    return [body.get("term"), body.get("coordinator"), body.get("release") or body.get("version")]


async def _converged(session: aiohttp.ClientSession, nodes: dict[str, str]) -> bool:
    """Every node names one coordinator (one term) and shows every node alive."""
    statuses = await asyncio.gather(*(_status(session, url) for url in nodes.values()))
    named = {(s[0], s[1]) for s in statuses if s is not None}
    if None in statuses or len(named) != 1 or next(iter(named))[1] is None:
        return False
    for url in nodes.values():
        try:
            code, body = await _json(session, "GET", f"{url}/v1/peers")
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False
        alive = {m["node_id"] for m in body.get("members", []) if m.get("state") == "alive"}
        if code != 200 or not set(nodes) <= alive:
            return False
    return True


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:g}s")
        await asyncio.sleep(0.2)


class Roll:
    """The background work during the roll: samples and ingest, until `stop` is set."""

    def __init__(self, session: aiohttp.ClientSession, nodes: dict[str, str], rate_hz: float):
        self.session = session
        self.nodes = nodes
        self.rate_hz = rate_hz
        self.stop = asyncio.Event()
        self.samples: list[dict[str, Any]] = []
        self.acked: list[list[str]] = []
        self.refused: list[list[Any]] = []

    async def sample(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            urls = list(self.nodes.values())
            answers = await asyncio.gather(*(_status(self.session, url) for url in urls))
            at = round(time.monotonic() - started, 3)
            self.samples.append({"at": at, "nodes": dict(zip(self.nodes, answers, strict=True))})
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def _post(self, index: int) -> None:
        node = list(self.nodes)[index % len(self.nodes)]
        key = f"roll-{index:05d}"
        url = f"{self.nodes[node]}/v1/records/games"
        try:
            code, body = await _json(
                self.session, "POST", url, POST_TIMEOUT_S, json=[_game(key, index)]
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.refused.append([key, node, f"{type(exc).__name__}: {exc}"])
            return
        if code in (200, 201):
            self.acked.append([key, node])
        else:
            self.refused.append([key, node, f"HTTP {code}: {body}"])

    async def ingest(self) -> None:
        """One game per tick at a fixed rate, each POST on its own (a slow node never slows
        the rate); every POST has ended when this returns."""
        posts: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        index = 0
        while not self.stop.is_set():
            task = asyncio.create_task(self._post(index))
            posts.add(task)
            task.add_done_callback(posts.discard)
            index += 1
            delay = started + index / self.rate_hz - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.gather(*posts)


async def _start_gang(
    session: aiohttp.ClientSession, url: str, size: int, argv: list[str]
) -> list[Any]:
    """[status, answer] of the gang's start (retried while there is no coordinator yet)."""
    job = {"job_id": GANG_ID, "argv": argv, "nodes": size}
    deadline = time.monotonic() + GANG_START_S
    while True:
        code, body = await _json(session, "POST", f"{url}/v1/jobs", json=job)
        if code != 503 or time.monotonic() > deadline:
            return [code, body]
        await asyncio.sleep(0.5)


async def _gang_end(session: aiohttp.ClientSession, url: str) -> Any:
    """The gang's record once it ended (its node may be restarting: retried until GANG_END_S)."""
    deadline = time.monotonic() + GANG_END_S
    while True:
        try:
            code, body = await _json(
                session, "GET", f"{url}/v1/jobs/{GANG_ID}/wait?timeout_s=20", 30.0
            )
            if code == 200 and body.get("ended_at") is not None:
                return body
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            return {"error": f"the gang did not end within {GANG_END_S:g}s"}
        await asyncio.sleep(0.5)


async def _missing(
    session: aiohttp.ClientSession, nodes: dict[str, str], keys: list[str]
) -> dict[str, list[str]]:
    """Per node, the keys of `keys` it does not hold."""
    missing: dict[str, list[str]] = {}
    for node, url in nodes.items():
        found: set[str] = set()
        for start in range(0, len(keys), KEYS_PER_GET):
            params = [("key", key) for key in keys[start : start + KEYS_PER_GET]]
            code, body = await _json(session, "GET", f"{url}/v1/records/games/get", params=params)
            if code != 200:
                raise RuntimeError(f"{node}: GET records/games/get: HTTP {code}: {body}")
            found.update(record["game_id"] for record in body["records"])
        missing[node] = sorted(set(keys) - found)
    return missing


async def _synced(
    session: aiohttp.ClientSession, nodes: dict[str, str], keys: list[str]
) -> dict[str, list[str]]:
    """Have every node pull games from the others until none lacks a key of `keys` (or
    SYNC_S passed); what each still lacks."""
    deadline = time.monotonic() + SYNC_S
    while True:
        missing = await _missing(session, nodes, keys)
        if not any(missing.values()) or time.monotonic() > deadline:
            return missing
        for node, lacking in missing.items():
            if lacking:
                body = {"categories": ["games"]}
                await _json(session, "POST", f"{nodes[node]}/v1/sync/run", 60.0, json=body)


async def run(args: argparse.Namespace, secret: bytes, nodes: dict[str, str]) -> None:
    out = Path(args.dir)
    middlewares = (signing_middleware(secret, "cli-rolling"),)
    async with aiohttp.ClientSession(middlewares=middlewares) as session:
        await _until(lambda: _converged(session, nodes), "one coordinator, all alive", CONVERGE_S)
        roll = Roll(session, nodes, args.rate_hz)
        background = [asyncio.create_task(roll.sample()), asyncio.create_task(roll.ingest())]
        release = out / "release"
        argv = [args.python, "-c", MEMBER, str(release), f"{MEMBER_LIMIT_S:g}", str(args.exit_code)]
        owner = next(iter(nodes.values()))
        start = await _start_gang(session, owner, len(nodes), argv)
        _write(out / "ready.json", {"gang": start})
        deadline = time.monotonic() + args.timeout_s
        while not (out / "stop").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        roll.stop.set()
        await asyncio.gather(*background)
        release.write_text("go\n", encoding="utf-8")
        ended = await _gang_end(session, owner)
        keys = sorted(key for key, _ in roll.acked)
        result = {
            "stopped_by": "stop" if (out / "stop").exists() else "timeout",
            "samples": roll.samples,
            "acked": roll.acked,
            "refused": roll.refused,
            "gang": {"start": start, "ended": ended},
            "missing": await _synced(session, nodes, keys),
        }
    _write(out / "result.json", result)


def _write(path: Path, document: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(document), encoding="utf-8")
    os.replace(temp, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--rate-hz", type=float, default=10.0)
    parser.add_argument("--exit-code", type=int, default=7)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    asyncio.run(run(args, read_secret_file(args.secret_file), json.loads(args.nodes)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
