"""TLS against plain HTTP on one daemon (auth hmac+tls serves both on its port): a large file
(GET /v1/sync/models/file), many small files (POST /v1/sync/models/files in batches, as sync
fetches them), each over plain HTTP (signed) and over TLS 1.3 (an operator certificate), in the
same run; and TLS handshakes per second, full and resumed with a session ticket. Each is
measured once per `--tls-workers` count (the daemon's `tls.workers`: 0, its event loop encrypts;
more, worker threads do), and while the large file goes over TLS a plain GET /v1/health every
20 ms says how long the daemon's loop makes other callers wait. Prints JSON.

    python -m bench.tls_bench [--size-mib 512] [--small-files 2000] [--small-bytes 4096]
                              [--tls-workers 0,2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.server import cpu_seconds, server_process
from config import signing_middleware

SECRET = b"tls-bench-secret-0123456789abcdef0123"
BATCH = 200
"""Small files per POST .../files request."""
CHUNK = 1 << 20
PING_GAP_S = 0.02


def _prepare(root: Path, size_mib: int, small_files: int, small_bytes: int) -> None:
    from config.tls import CertRole, init_ca, issue_certificate

    models = root / "data" / "models"
    (models / "small").mkdir(parents=True)
    block = os.urandom(CHUNK)
    with (models / "big.bin").open("wb") as handle:
        for _ in range(size_mib):
            handle.write(block)
    for index in range(small_files):
        (models / "small" / f"f{index:05d}.bin").write_bytes(os.urandom(small_bytes))
    init_ca(root / "ca")
    issue_certificate(root / "ca", "bench", CertRole.NODE, out=root / "tls", sans=["127.0.0.1"])
    issue_certificate(root / "ca", "alice", CertRole.OPERATOR, out=root / "tls")
    secret = root / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)


async def _serve(root: Path, workers: int) -> None:
    import signal

    from config import load_settings
    from node.daemon import NodeDaemon

    tls = root / "tls"
    flags: dict[str, Any] = {
        "data_dir": root / "data",
        "node_id": "bench",
        "port": 0,
        "mdns": False,
        "secret_file": root / "secret",
        "sync_interval_s": 0,
        "auth": "hmac+tls",
        "tls": {
            "ca": tls / "ca.crt",
            "cert": tls / "bench.crt",
            "key": tls / "bench.key",
            "workers": workers,
        },
    }
    settings = load_settings(env={}, flags=flags).settings
    async with NodeDaemon(settings) as daemon:
        sys.stdout.write(f"PORT {daemon.port}\n")
        sys.stdout.flush()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def _client_context(root: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(cafile=root / "tls" / "ca.crt")
    context.load_cert_chain(root / "tls" / "alice.crt", root / "tls" / "alice.key")
    return context


def _session(tls: bool, context: ssl.SSLContext) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    if tls:
        return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=context))
    return aiohttp.ClientSession(
        timeout=timeout, middlewares=(signing_middleware(SECRET, "cli-bench"),)
    )


async def _manifest(session: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params = {"limit": "1000", **({"after": after} if after else {})}
        async with session.get(f"{base}/v1/sync/models/manifest", params=params) as response:
            response.raise_for_status()
            page = await response.json()
        entries.extend(page["entries"])
        after = page.get("next")
        if not after:
            return entries


async def _wait_hashed(base: str, context: ssl.SSLContext, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 600
    async with _session(False, context) as session:
        while True:
            entries = await _manifest(session, base)
            hashed = [entry for entry in entries if entry.get("hash")]
            if len(hashed) >= count:
                return hashed
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(hashed)} of {count} files hashed after 600 s")
            await asyncio.sleep(0.5)


async def _large(base: str, tls: bool, context: ssl.SSLContext) -> tuple[int, float]:
    async with _session(tls, context) as session:
        started = time.perf_counter()
        received = 0
        async with session.get(
            f"{base}/v1/sync/models/file", params={"path": "big.bin"}
        ) as response:
            response.raise_for_status()
            async for chunk in response.content.iter_chunked(CHUNK):
                received += len(chunk)
        return received, time.perf_counter() - started


def _pinged(plain: str, stop: threading.Event, waits: list[float]) -> None:
    """GET /v1/health (signed, plain HTTP) every PING_GAP_S until `stop`; each answer's wait.
    In its own thread and loop, so the client's decryption does not delay it."""

    async def ping() -> None:
        async with _session(False, ssl.create_default_context()) as session:
            while not stop.is_set():
                started = time.perf_counter()
                async with session.get(f"{plain}/v1/health") as response:
                    await response.read()
                waits.append(time.perf_counter() - started)
                await asyncio.sleep(PING_GAP_S)

    asyncio.run(ping())


def _waits(waits: list[float]) -> dict[str, float | None]:
    """The answers' count and waits (None without an answer: the file took less than one)."""
    ordered = sorted(waits)
    if not ordered:
        return {"answers": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "answers": len(waits),
        "p50_ms": round(1000 * ordered[len(ordered) // 2], 2),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "max_ms": round(1000 * ordered[-1], 2),
    }


async def _small(
    base: str, tls: bool, context: ssl.SSLContext, files: list[dict[str, Any]]
) -> tuple[int, float]:
    async with _session(tls, context) as session:
        started = time.perf_counter()
        received = 0
        for start in range(0, len(files), BATCH):
            batch = [{"path": f["path"], "hash": f["hash"]} for f in files[start : start + BATCH]]
            async with session.post(
                f"{base}/v1/sync/models/files", json={"files": batch}
            ) as response:
                response.raise_for_status()
                received += len(await response.read())
        return received, time.perf_counter() - started


def _handshakes(port: int, context: ssl.SSLContext, count: int, resume: bool) -> dict[str, Any]:
    session = None
    reused = 0
    request = b"GET /v1/health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    started = time.perf_counter()
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        with context.wrap_socket(
            raw, server_hostname="bench", session=session if resume else None
        ) as wrapped:
            reused += int(wrapped.session_reused)
            wrapped.sendall(request)
            while wrapped.recv(65536):
                pass
            if resume:
                session = wrapped.session
    elapsed = time.perf_counter() - started
    return {
        "connections": count,
        "resumed": reused,
        "per_s": round(count / elapsed, 1),
        "note": "each: TCP connect, TLS 1.3 handshake, GET /v1/health, close",
    }


async def _measure(
    root: Path, port: int, files: int, size_bytes: int, server_pid: int
) -> dict[str, Any]:
    context = _client_context(root)
    plain, secure = f"http://127.0.0.1:{port}", f"https://127.0.0.1:{port}"
    hashed = await _wait_hashed(plain, context, files + 1)
    small = [entry for entry in hashed if entry["path"].startswith("small/")]
    result: dict[str, Any] = {"large": {}, "small": {}}
    for tls, base in ((False, plain), (True, secure), (False, plain), (True, secure)):
        key = "tls" if tls else "plain"
        cpu_before = time.process_time() + cpu_seconds(server_pid)
        loop_before = cpu_seconds(server_pid, thread=server_pid)
        stop, waits = threading.Event(), []
        pinger = threading.Thread(target=_pinged, args=(plain, stop, waits))
        pinger.start()
        try:
            received, elapsed = await _large(base, tls, context)
        finally:
            stop.set()
            await asyncio.to_thread(pinger.join)
        cpu = time.process_time() + cpu_seconds(server_pid) - cpu_before
        loop_cpu = cpu_seconds(server_pid, thread=server_pid) - loop_before
        assert received == size_bytes, (received, size_bytes)
        best = result["large"].get(key)
        rate = received / elapsed / 2**20
        if best is None or rate > best["mib_s"]:
            result["large"][key] = {
                "bytes": received,
                "s": round(elapsed, 3),
                "mib_s": round(rate, 1),
                "cpu_s_client_and_server": round(cpu, 3),
                "cpu_s_server_loop_thread": round(loop_cpu, 3),
                "health_wait_meanwhile": _waits(waits),
            }
        received, elapsed = await _small(base, tls, context, small)
        best = result["small"].get(key)
        per_s = len(small) / elapsed
        if best is None or per_s > best["files_s"]:
            result["small"][key] = {
                "files": len(small),
                "answer_bytes": received,
                "s": round(elapsed, 3),
                "files_s": round(per_s, 1),
            }
    for part, unit in (("large", "mib_s"), ("small", "files_s")):
        result[part]["tls_over_plain"] = round(
            result[part]["tls"][unit] / result[part]["plain"][unit], 3
        )
    result["handshakes"] = {
        "full": await asyncio.to_thread(_handshakes, port, context, 200, False),
        "resumed": await asyncio.to_thread(_handshakes, port, context, 200, True),
    }
    result["tls_workers_terminated"] = await _terminated(plain, context)
    return result


async def _terminated(plain: str, context: ssl.SSLContext) -> float | None:
    """The connections the daemon's TLS workers terminated, by its `tls_workers` health check
    (run every second: the first run after now; None: the daemon runs none)."""
    since = time.time()
    async with _session(False, context) as session:
        for _ in range(50):
            async with session.get(f"{plain}/v1/health") as response:
                health = await response.json()
            found = [c for c in health["components"] if c["name"] == "tls_workers"]
            if not found:
                return None
            checked = found[0]["last_check"]
            if checked is not None and checked >= since and found[0]["metrics"]:
                return float(found[0]["metrics"]["terminated"])
            await asyncio.sleep(0.2)
    raise RuntimeError("the daemon's tls_workers health check did not run within 10 s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode")
    serve = sub.add_parser("serve")
    serve.add_argument("root", type=Path)
    serve.add_argument("--workers", type=int, default=0)
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--small-files", type=int, default=2000)
    parser.add_argument("--small-bytes", type=int, default=4096)
    parser.add_argument(
        "--tls-workers",
        default="0,2",
        help="comma-separated tls.workers counts, each measured in turn (default 0,2)",
    )
    args = parser.parse_args(argv)
    if args.mode == "serve":
        asyncio.run(_serve(args.root, args.workers))
        return 0
    counts = [int(count) for count in args.tls_workers.split(",")]
    runs: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="tls-bench-") as temp:
        root = Path(temp)
        _prepare(root, args.size_mib, args.small_files, args.small_bytes)
        for count in counts:
            pids: list[int] = []
            argv = ["-m", "bench.tls_bench", "serve", str(root), "--workers", str(count)]
            with server_process(argv, pids) as port:
                size = args.size_mib * 2**20
                runs[str(count)] = asyncio.run(
                    _measure(root, port, args.small_files, size, pids[0])
                )
    result = dict(runs[str(counts[0])])
    result["by_tls_workers"] = runs
    result["setup"] = {
        "size_mib": args.size_mib,
        "small_files": args.small_files,
        "small_bytes": args.small_bytes,
        "batch": BATCH,
        "tls": "TLS 1.3, EC P-256 certificates, operator client certificate",
        "plain": "HTTP signed with the cluster secret",
        "server": "one shoal daemon (auth hmac+tls) in a child process on 127.0.0.1",
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "ssl": ssl.OPENSSL_VERSION,
    }
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
