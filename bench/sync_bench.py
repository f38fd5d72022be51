"""File sync speed, each number beside its baseline from the same run.

1. A verified 1 GiB checkpoint pulled over loopback HTTP (server in a subprocess; WAL-logged,
   every piece hashed, fsync, rename, fsync of the directory) vs `dd bs=4M conv=fsync` and
   `rsync -a --fsync` copying the same file locally. Best of --trials, all samples listed.
0. 2,000 small files (256 B - 2 KB, 20 directories) pulled into an empty category over
   loopback HTTP, in batches (one request and one WAL entry per batch, every file verified
   and fsynced, one fsync per directory) and, for comparison, one file per request; vs
   `rsync -a --fsync` of the same tree into an empty directory on the same disk. The
   server's manifest is hashed once before the timed pulls (`server_first_hash_s`). The same
   through the CLI as a user types it (`shoal_cli`): `shoal sync training --from src` against a
   `shoal serve` node joined to a source node, timed from exec to exit. CPU seconds of the
   batched pull (client and server) beside rsync's (its processes), as a load-proof ratio.
2. A no-op sync of a 100,000-file category (both nodes already hold the same tree) vs
   `rsync -a -n` of the same two trees: "strict", the server rescans its tree for every
   manifest request (like rsync); "default", the server's FileCatalog settings (a listing is
   reused while younger than 10x the time it took). The client rescans its tree every time.
3. Fan-out (bench/fanout_bench.py): a new checkpoint of --fanout-mib from 1 origin to
   --fanout-nodes loopback daemons, every node capped at --fanout-cap-mbps MB/s upload: the
   time until all hold a verified copy vs one capped transfer, and the origin's egress.
Prints one JSON document. Usage: python bench/sync_bench.py [--small-files 2000]
[--small-batched-only] [--size-mib 1024] [--files 100000] [--trials 3] [--streams 2]
[--fanout-mib 256] [--fanout-nodes 8] [--fanout-cap-mbps 50] [--dir DIR] [--time-limit-s 600]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
SHOAL = Path(sys.executable).parent / "shoal"
"""The `shoal` command of this interpreter's environment (as a user runs it)."""
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.fanout_bench import fanout  # noqa: E402
from bench.server import cpu_seconds, serve_until_sigterm, server_process  # noqa: E402
from config import Timeouts  # noqa: E402
from sync import (  # noqa: E402
    FileCatalog,
    HttpTransport,
    PeerRef,
    SpaceReserve,
    SyncCoordinator,
    SyncOptions,
    file_routes,
)
from wal import WriteAheadLog  # noqa: E402

CATEGORIES = ("models", "training")
TIMEOUTS = Timeouts(sync_s=600.0, sync_piece_s=60.0)


def _catalog(base: Path, strict: bool = True) -> FileCatalog:
    roots = {category: base / category for category in CATEGORIES}
    if not strict:
        return FileCatalog(roots, base / "cache")
    return FileCatalog(roots, base / "cache", listing_fresh_s=0.0, scan_interval_factor=0.0)


async def serve(base: Path, strict: bool) -> None:
    """The server node: file routes over `base`, printing `PORT n`, until SIGTERM."""
    async with _catalog(base, strict) as catalog:
        app = web.Application()
        app.router.add_routes(file_routes(catalog))
        await serve_until_sigterm(app)


@contextlib.contextmanager
def server(base: Path, strict: bool = True, pids: list[int] | None = None) -> Iterator[PeerRef]:
    argv = [__file__, "--serve", str(base)] + ([] if strict else ["--default-catalog"])
    with server_process(argv, pids) as port:
        yield PeerRef("server", f"http://127.0.0.1:{port}")


@contextlib.asynccontextmanager
async def client(base: Path, streams: int, batch: bool = True) -> AsyncIterator[SyncCoordinator]:
    options = SyncOptions(
        timeouts=TIMEOUTS,
        reserve=SpaceReserve(1 << 30, 0.0),
        batch_file_bytes=SyncOptions.batch_file_bytes if batch else 0,
    )
    async with (
        _catalog(base) as catalog,
        WriteAheadLog(base / "wal.db") as wal,
        HttpTransport(node_id="client", timeouts=TIMEOUTS, streams=streams) as http,
        SyncCoordinator(
            catalog, http, self_peer=PeerRef("client", "http://127.0.0.1:9"), wal=wal,
            options=options,
        ) as coordinator,
    ):  # fmt: skip
        yield coordinator


def run_timed(
    argv: list[str], cpu: list[float] | None = None, user: list[float] | None = None
) -> float:
    """Seconds `argv` took to run (it must succeed); its CPU seconds (its children's too)
    appended to `cpu`, and its user CPU seconds to `user`, when given."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    elapsed = time.perf_counter() - started
    if cpu is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if user is not None:
            user.append(after.ru_utime - before.ru_utime)
    return elapsed


def write_random(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    block = os.urandom(8 << 20)
    with path.open("wb") as out:
        written = 0
        while written < size:
            piece = block[: min(len(block), size - written)]
            out.write(hashlib.sha256(written.to_bytes(8, "little")).digest() + piece[32:])
            written += len(piece)


def hash_speeds() -> dict[str, float]:
    data = os.urandom(64 << 20)
    speeds: dict[str, float] = {}
    for name in ("sha256", "blake2b", "md5"):
        started = time.perf_counter()
        hashlib.new(name, data).digest()
        speeds[f"{name}_MBps"] = round(len(data) / (time.perf_counter() - started) / 1e6)
    return speeds


async def checkpoint(work: Path, size: int, trials: int, streams: int) -> dict[str, Any]:
    server_dir, client_dir = work / "server", work / "client"
    source = server_dir / "models" / "ckpt.pt"
    write_random(source, size)
    copies = work / "copies"
    copies.mkdir()
    samples: dict[str, list[float]] = {"http": [], "dd": [], "rsync": []}
    with server(server_dir) as peer:
        async with HttpTransport(timeouts=TIMEOUTS) as http:
            started = time.perf_counter()
            await http.list_manifest(peer, "models")  # the server hashes the new file once
            server_hash_s = time.perf_counter() - started
        for _ in range(trials):
            target = copies / "dd.pt"
            os.sync()
            samples["dd"].append(
                run_timed(
                    ["dd", f"if={source}", f"of={target}", "bs=4M", "conv=fsync", "status=none"]
                )
            )
            target.unlink()
            target = copies / "rsync.pt"
            os.sync()
            samples["rsync"].append(run_timed(["rsync", "-a", "--fsync", str(source), str(target)]))
            target.unlink()
            os.sync()
            async with client(client_dir, streams) as coordinator:
                started = time.perf_counter()
                stats = await coordinator.sync("models", [peer])
                samples["http"].append(time.perf_counter() - started)
                assert stats.files_transferred == 1, stats
                assert not stats.errors, stats
            pulled = client_dir / "models" / "ckpt.pt"
            assert pulled.stat().st_size == size
            pulled.unlink()
    best = {name: min(values) for name, values in samples.items()}
    mbps = {name: round(size / seconds / 1e6, 1) for name, seconds in best.items()}
    return {
        "size_bytes": size,
        "trials": trials,
        "streams": streams,
        "server_first_hash_s": round(server_hash_s, 3),
        "best_s": {name: round(value, 3) for name, value in best.items()},
        "median_s": _medians(samples),
        "samples_s": {name: [round(v, 3) for v in values] for name, values in samples.items()},
        "MBps": mbps,
        "median_http_vs_rsync_time": _ratio(samples, "http", "rsync"),
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "http_vs_dd": round(mbps["http"] / mbps["dd"], 2),
        "http_vs_rsync": round(mbps["http"] / mbps["rsync"], 2),
        "targets": {
            "at_least_0.7x_dd": mbps["http"] >= 0.7 * mbps["dd"],
            "faster_than_rsync": mbps["http"] > mbps["rsync"],
        },
    }


def _medians(samples: dict[str, list[float]]) -> dict[str, float]:
    """The median of each sample list: the disk's fsync latency here swings 2x within
    minutes, so the best alone can flatter either side."""
    return {name: round(statistics.median(values), 3) for name, values in samples.items()}


def _ratio(samples: dict[str, list[float]], name: str, baseline: str) -> float:
    return round(statistics.median(samples[name]) / statistics.median(samples[baseline]), 2)


def make_small_tree(root: Path, count: int) -> int:
    """`count` files of 256 B - 2 KB in 20 directories; returns their total size."""
    rng = random.Random(15)
    total = 0
    for index in range(count):
        directory = root / f"shard-{index % 20:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(rng.randint(256, 2048))
        (directory / f"game-{index:05d}.json").write_bytes(data)
        total += len(data)
    return total


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def shoal_node(data_dir: Path, name: str, port: int, seeds: tuple[int, ...] = ()) -> Iterator[str]:
    """`shoal serve` as a user starts it (no background sync, no mDNS); yields its URL once
    it answers /v1/status and, with seeds, lists them alive; SIGTERM on exit."""
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir.parent / f"{name}.yaml"
    config.write_text("sync_interval_s: 0\n")
    argv = [
        str(SHOAL), "serve", "--node-id", name, "--port", str(port), "--data-dir", str(data_dir),
        "--config", str(config), "--no-mdns",
        *(arg for seed in seeds for arg in ("--seed", f"127.0.0.1:{seed}")),
    ]  # fmt: skip
    log = (data_dir.parent / f"{name}.log").open("ab")
    process = subprocess.Popen(argv, stdout=log, stderr=log, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _alive_peers(url, len(seeds)):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"shoal node {name} did not come up: see {log.name}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _alive_peers(url: str, wanted: int) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/peers", timeout=2) as answer:
            members = json.loads(answer.read())["members"]
    except (OSError, ValueError, KeyError):
        return False
    alive = [m for m in members if m.get("state") == "alive" and not m.get("is_self")]
    return len(alive) >= wanted


def cli_sync_timed(node_url: str, source: str) -> float:
    """`shoal sync training --from SOURCE --node URL --json`, timed from exec to exit."""
    argv = [str(SHOAL), "sync", "training", "--from", source, "--node", node_url, "--json"]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"shoal sync failed ({done.returncode}): {done.stdout}{done.stderr}")
    return elapsed


def _warm_manifest(url: str) -> None:
    """Make the source hash its tree before the timed runs (as the in-process server's)."""
    with urllib.request.urlopen(f"{url}/v1/sync/training/manifest", timeout=120) as answer:
        answer.read()


async def small_files(work: Path, count: int, trials: int, batched_only: bool) -> dict[str, Any]:
    """Each trial: rsync, the batched pull, then (unless `batched_only`) the pull of one file
    per request and the CLI's sync, each into an empty directory."""
    server_dir, copies = work / "server", work / "copies"
    total = make_small_tree(server_dir / "training", count)
    copies.mkdir(parents=True, exist_ok=True)
    modes = ("shoal_batched",) if batched_only else ("shoal_batched", "shoal_per_file")
    samples: dict[str, list[float]] = {name: [] for name in ("rsync", *modes)}
    if not batched_only:
        samples["shoal_cli"] = []
    cpu: dict[str, list[float]] = {name: [] for name in ("shoal_batched", "rsync")}
    cpu.update({f"{name}_user": [] for name in ("shoal_batched", "rsync")})
    source_port = _free_port()
    pids: list[int] = []
    with contextlib.ExitStack() as stack:
        peer = stack.enter_context(server(server_dir, pids=pids))
        if not batched_only:
            shutil.copytree(server_dir / "training", work / "nodes" / "src" / "training")
            source = work / "nodes" / "src"
            _warm_manifest(stack.enter_context(shoal_node(source, "src", source_port)))
        async with HttpTransport(timeouts=TIMEOUTS) as http:
            started = time.perf_counter()
            await http.list_manifest(peer, "training")  # the server hashes its tree once
            server_hash_s = time.perf_counter() - started
        for trial in range(trials):
            target = copies / f"rsync-{trial}"
            os.sync()
            rsync = ["rsync", "-a", "--fsync", f"{server_dir / 'training'}/", f"{target}/"]
            samples["rsync"].append(run_timed(rsync, cpu["rsync"], cpu["rsync_user"]))
            shutil.rmtree(target)
            for mode in modes:
                client_dir = copies / f"{mode}-{trial}"
                await _pull_small(client_dir, peer, count, mode, samples, cpu, pids[0])
                shutil.rmtree(client_dir)
            if not batched_only:
                samples["shoal_cli"].append(_cli_small(work, trial, source_port, count))
    return _small_result(count, total, trials, server_hash_s, samples, cpu)


async def _pull_small(
    client_dir: Path,
    peer: PeerRef,
    count: int,
    mode: str,
    samples: dict[str, list[float]],
    cpu: dict[str, list[float]],
    server_pid: int,
) -> None:
    """One pull of the small tree into `client_dir`, its seconds (and CPU seconds of client and
    server where `cpu` has `mode`) appended."""
    os.sync()
    async with client(client_dir, 1, batch=mode == "shoal_batched") as coordinator:
        started, cpu_before = time.perf_counter(), _cpu_both(server_pid)
        stats = await coordinator.sync("training", [peer])
        samples[mode].append(time.perf_counter() - started)
        if mode in cpu:
            (total, user), (total_before, user_before) = _cpu_both(server_pid), cpu_before
            cpu[mode].append(total - total_before)
            cpu[f"{mode}_user"].append(user - user_before)
        assert stats.files_transferred == count, stats
        assert not stats.errors, stats


def _cpu_both(server_pid: int) -> tuple[float, float]:
    """CPU seconds, all and user only, of this process (the pulling client, its threads
    included) and the server together."""
    own = os.times()
    return (
        own.user + own.system + cpu_seconds(server_pid),
        own.user + cpu_seconds(server_pid, user_only=True),
    )


def _cli_small(work: Path, trial: int, source_port: int, count: int) -> float:
    """`shoal sync training --from src` into a new node joined to the source, timed."""
    destination = work / "nodes" / f"dst-{trial}"
    with shoal_node(destination, f"dst-{trial}", _free_port(), (source_port,)) as url:
        os.sync()
        elapsed = cli_sync_timed(url, "src")
    copied = sum(1 for p in (destination / "training").rglob("*") if p.is_file())
    assert copied == count, f"shoal sync copied {copied} of {count} files"
    shutil.rmtree(destination)
    return elapsed


def _small_result(
    count: int,
    total: int,
    trials: int,
    server_hash_s: float,
    samples: dict[str, list[float]],
    cpu: dict[str, list[float]],
) -> dict[str, Any]:
    best = {name: min(values) for name, values in samples.items()}
    result: dict[str, Any] = {
        "files": count,
        "bytes": total,
        "trials": trials,
        "server_first_hash_s": round(server_hash_s, 3),
        "best_s": {name: round(value, 3) for name, value in best.items()},
        "median_s": _medians(samples),
        "samples_s": {name: [round(v, 3) for v in values] for name, values in samples.items()},
        "ms_per_file": {name: round(value / count * 1000, 3) for name, value in best.items()},
        "batched_vs_rsync_time": round(best["shoal_batched"] / best["rsync"], 2),
        "median_batched_vs_rsync_time": _ratio(samples, "shoal_batched", "rsync"),
        "median_cpu_s": _medians(cpu),
        "median_batched_vs_rsync_cpu": _ratio(cpu, "shoal_batched", "rsync"),
        "median_batched_vs_rsync_user_cpu": _ratio(cpu, "shoal_batched_user", "rsync_user"),
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "targets": {"batched_faster_than_rsync": best["shoal_batched"] < best["rsync"]},
    }
    if "shoal_cli" in best:
        result["cli_vs_rsync_time"] = round(best["shoal_cli"] / best["rsync"], 2)
        result["median_cli_vs_rsync_time"] = _ratio(samples, "shoal_cli", "rsync")
        result["targets"]["cli_faster_than_rsync"] = best["shoal_cli"] < best["rsync"]
    return result


def make_tree(root: Path, count: int) -> None:
    for index in range(count):
        directory = root / f"d{index // 1000:03d}"
        if index % 1000 == 0:
            directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"f{index:06d}.bin"
        path.write_bytes(index.to_bytes(4, "little") * (index % 50))
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000 + index))


async def noop_sync(work: Path, count: int, trials: int) -> dict[str, Any]:
    server_dir, client_dir = work / "server", work / "client"
    started = time.perf_counter()
    make_tree(server_dir / "training", count)
    make_tree(client_dir / "training", count)
    created_s = time.perf_counter() - started
    rsync = ["rsync", "-a", "-n", f"{server_dir / 'training'}/", f"{client_dir / 'training'}/"]
    samples: dict[str, list[float]] = {"strict": [], "default": [], "rsync_n": []}
    result: dict[str, Any] = {"files": count, "tree_created_s": round(created_s, 2)}
    async with client(client_dir, 1) as coordinator:
        for mode in ("strict", "default"):
            with server(server_dir, strict=mode == "strict") as peer:
                coordinator.http._manifests.clear()
                started = time.perf_counter()
                first = await coordinator.sync("training", [peer])
                result[f"{mode}_first_sync_s"] = round(time.perf_counter() - started, 3)
                assert first.files_transferred == 0, first
                assert not first.errors, first
                for _ in range(trials):
                    samples["rsync_n"].append(run_timed(rsync))
                    started = time.perf_counter()
                    stats = await coordinator.sync("training", [peer])
                    samples[mode].append(time.perf_counter() - started)
                    assert stats.files_transferred == 0, stats
                    assert not stats.errors, stats
    best = {name: min(values) for name, values in samples.items()}
    result.update(
        {
            "note": "first_sync includes hashing each tree once (strict) and the full manifest "
            "transfer; later syncs get 304 for an unchanged manifest",
            "best_s": {name: round(value, 3) for name, value in best.items()},
            "samples_s": {name: [round(v, 3) for v in values] for name, values in samples.items()},
            "targets": {
                "strict_under_1s": best["strict"] < 1.0,
                "strict_faster_than_rsync_n": best["strict"] < best["rsync_n"],
                "default_under_1s": best["default"] < 1.0,
                "default_faster_than_rsync_n": best["default"] < best["rsync_n"],
            },
        }
    )
    return result


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="shoal-sync-bench-", dir=args.dir))
    try:
        result: dict[str, Any] = {"hash": {"algorithm": "sha256", **hash_speeds()}}
        if args.small_files > 0:
            result["small_files"] = await small_files(
                base / "small", args.small_files, args.trials, args.small_batched_only
            )
        if args.size_mib > 0:
            result["checkpoint"] = await checkpoint(
                base / "ckpt", args.size_mib << 20, args.trials, args.streams
            )
        if args.files > 0:
            result["noop_sync"] = await noop_sync(base / "tree", args.files, args.trials)
        if args.fanout_mib > 0:
            result["fanout"] = await fanout(
                base / "fanout", args.fanout_mib, args.fanout_nodes, args.fanout_cap_mbps * 1e6
            )
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--default-catalog", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--small-files", type=int, default=2000)
    parser.add_argument(
        "--small-batched-only",
        action="store_true",
        help="small files: only rsync and the batched pull (no per-file pull, no CLI nodes)",
    )
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--fanout-mib", type=int, default=256, help="0: no fan-out run")
    parser.add_argument("--fanout-nodes", type=int, default=8)
    parser.add_argument("--fanout-cap-mbps", type=float, default=50.0)
    parser.add_argument("--dir", default=None, help="where to make the temp tree (default /tmp)")
    parser.add_argument("--time-limit-s", type=float, default=600.0)
    args = parser.parse_args()
    if args.serve is not None:
        asyncio.run(serve(args.serve, strict=not args.default_catalog))
        return
    started = time.perf_counter()

    async def bounded() -> dict[str, Any]:
        async with asyncio.timeout(args.time_limit_s):
            return await bench(args)

    result = asyncio.run(bounded())
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
