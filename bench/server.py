"""The server side of the HTTP benchmarks: an aiohttp app served on 127.0.0.1 in a child
process that prints `PORT n` and runs until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]


async def serve_until_sigterm(app: web.Application) -> None:
    """Serve `app` on a free port of 127.0.0.1, print `PORT n`, return on SIGTERM."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        sys.stdout.write(f"PORT {runner.addresses[0][1]}\n")
        sys.stdout.flush()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def server_process(argv: list[str]) -> Iterator[int]:
    """Run `python argv...` (a benchmark in its serve mode); yield its port; SIGTERM it after."""
    process = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"benchmark server {argv} did not start: {line!r}")
        yield int(line.split()[1])
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
