"""Fan-out of one new checkpoint from 1 origin to N loopback daemons (`shoal serve`, each in
its own process, every one capped at the same upload rate), beside one capped transfer of
the same size from the same origin to one node. Used by bench/sync_bench.py (`--fanout-mib`).

The single transfer runs first, with only the origin and one puller alive (category
`training`); then the other pullers join and all N pull a second file of the same size
(category `models`) at once. Origin egress is the origin's `served_bytes` of that category
(`GET /v1/sync/status`, also `shoal_sync_bytes_served_total`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout

ROOT = Path(__file__).resolve().parents[1]
START_LIVENESS_S = 60.0
MEET_LIVENESS_S = 60.0
CONFIG = """\
sync_interval_s: 0
sync_upload_limit_bytes_s: {cap}
timeouts:
  sync_s: 1800
  sync_piece_s: 120
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Daemons:
    """`shoal serve` processes on loopback, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, work: Path, cap_bytes_s: float) -> None:
        self.work = work
        self.config = work / "node.yaml"
        self.config.write_text(CONFIG.format(cap=cap_bytes_s))
        self.ports: dict[str, int] = {}
        self.processes: list[subprocess.Popen[bytes]] = []

    def data_dir(self, node: str) -> Path:
        return self.work / node

    def start(self, node: str, seed: int | None) -> int:
        port = _free_port()
        args = ["serve", "--node-id", node, "--data-dir", str(self.data_dir(node))]
        args += ["--config", str(self.config), "--port", str(port)]
        args += ["--no-mdns", "--bind", "127.0.0.1"]
        if seed is not None:
            args += ["--seed", f"127.0.0.1:{seed}"]
        log = (self.work / f"{node}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "node", *args], cwd=ROOT, stdout=log, stderr=log
            )
        )
        self.ports[node] = port
        return port

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[node]}"


@contextlib.contextmanager
def daemons(work: Path, cap_bytes_s: float) -> Iterator[Daemons]:
    group = Daemons(work, cap_bytes_s)
    try:
        yield group
    finally:
        group.stop()


async def _get(session: ClientSession, url: str) -> Any:
    async with session.get(url) as answer:
        answer.raise_for_status()
        return await answer.json()


async def _until(session: ClientSession, group: Daemons, nodes: list[str], peers: int) -> None:
    """Until each of `nodes` answers and sees `peers` alive peers."""
    deadline = time.monotonic() + START_LIVENESS_S + MEET_LIVENESS_S
    for node in nodes:
        while True:
            with contextlib.suppress(OSError, ValueError):
                status = await _get(session, f"{group.url(node)}/v1/sync/status")
                if len(status["peers"]) >= peers:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node} never saw {peers} peers; see {group.work}/{node}.log")
            await asyncio.sleep(0.2)


async def _pull(session: ClientSession, group: Daemons, node: str, category: str) -> float:
    started = time.perf_counter()
    body = {"categories": [category], "from": "origin"}
    async with session.post(f"{group.url(node)}/v1/sync/run", json=body) as answer:
        answer.raise_for_status()
        result = await answer.json()
    stats = result["files"][category]
    if stats["errors"] or stats["files_transferred"] != 1:
        raise RuntimeError(f"{node}: {stats}")
    return time.perf_counter() - started


def _write(path: Path, size: int, seed: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest() * (1 << 15)  # 1 MiB
    with path.open("wb") as out:
        for index in range(size >> 20):
            chunk = index.to_bytes(8, "little") + block[8:]
            out.write(chunk)
            digest.update(chunk)
    return digest.hexdigest()


def _digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


async def fanout(work: Path, size_mib: int, nodes: int, cap_bytes_s: float) -> dict[str, Any]:
    """Time one capped transfer, then the fan-out to `nodes` pullers (see the module doc)."""
    size = size_mib << 20
    work.mkdir(parents=True, exist_ok=True)
    pullers = [f"n{i}" for i in range(1, nodes + 1)]
    with daemons(work, cap_bytes_s) as group:
        origin = group.data_dir("origin")
        single_hash = _write(origin / "training" / "single.bin", size, 1)
        fan_hash = _write(origin / "models" / "fanout.bin", size, 2)
        seed = group.start("origin", None)
        group.start(pullers[0], seed)
        async with ClientSession(timeout=ClientTimeout(total=None)) as session:
            await _until(session, group, ["origin", pullers[0]], 1)
            for category in ("training", "models"):  # the origin hashes its files once, untimed
                await _get(session, f"{group.url('origin')}/v1/sync/{category}/manifest")
            single_s = await _pull(session, group, pullers[0], "training")
            if _digest(group.data_dir(pullers[0]) / "training" / "single.bin") != single_hash:
                raise RuntimeError("the single transfer's copy does not verify")
            for node in pullers[1:]:
                group.start(node, seed)
            await _until(session, group, ["origin", *pullers], nodes)
            before = (await _get(session, f"{group.url('origin')}/v1/sync/status"))["fanout"]
            served_before = before.get("models", {}).get("served_bytes", 0)
            started = time.perf_counter()
            each = await asyncio.gather(*(_pull(session, group, n, "models") for n in pullers))
            total_s = time.perf_counter() - started
            after = await _get(session, f"{group.url('origin')}/v1/sync/status")
            egress = after["fanout"]["models"]["served_bytes"] - served_before
            from_peers = 0
            for node in pullers:
                copy = group.data_dir(node) / "models" / "fanout.bin"
                if _digest(copy) != fan_hash:
                    raise RuntimeError(f"{node}'s copy does not verify")
                status = await _get(session, f"{group.url(node)}/v1/sync/status")
                from_peers += status["fanout"].get("models", {}).get("from_peers_bytes", 0)
    return {
        "size_bytes": size,
        "pullers": nodes,
        "upload_cap_bytes_s": cap_bytes_s,
        "single_capped_transfer_s": round(single_s, 3),
        "fanout_total_s": round(total_s, 3),
        "fanout_per_puller_s": sorted(round(value, 3) for value in each),
        "fanout_vs_single": round(total_s / single_s, 2),
        "origin_egress_bytes": egress,
        "origin_egress_copies": round(egress / size, 2),
        "bytes_from_peers": from_peers,
        "every_copy_verified": True,
        "targets": {
            "time_at_most_1.3x_single": total_s <= 1.3 * single_s,
            "egress_at_most_1.5x_file": egress <= 1.5 * size,
        },
    }
