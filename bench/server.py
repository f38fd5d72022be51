"""The server side of the HTTP benchmarks: an aiohttp app served on 127.0.0.1 in a child
process that prints `PORT n` and runs until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
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


def cpu_seconds(pid: int, user_only: bool = False, thread: int | None = None) -> float:
    """User + system (or user only) CPU seconds process `pid` has used so far, its threads
    included, or only its thread `thread` (a thread id; `pid` is its main thread's) (Linux)."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + (0 if user_only else int(fields[12]))
    return ticks / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server_process(argv: list[str], pids: list[int] | None = None) -> Iterator[int]:
    """Run `python argv...` (a benchmark in its serve mode); yield its port; SIGTERM it after.
    Its process id is appended to `pids` when given (for cpu_seconds)."""
    process = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if pids is not None:
        pids.append(process.pid)
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
