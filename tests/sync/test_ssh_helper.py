"""The rsync remote-shell helper (`python -m sync.transports.ssh --relay`): when it cannot
carry the relayed stream (the relay's socket fails, or rsync's end of its pipes is gone), it
says so on stderr as one marker line and exits 255 like ssh, so rsync's "connection
unexpectedly closed" has a cause in the transfer's error."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from sync.transports.ssh import EXIT_SSH_FAILED, FRAME, MARKER, STDOUT

ROOT = Path(__file__).resolve().parents[2]


async def test_a_stdout_that_cannot_be_written_is_reported_as_a_marker_line(
    tmp_path: Path,
) -> None:
    socket_path = tmp_path / "relay.sock"

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(FRAME.pack(STDOUT, 5) + b"hello")
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_unix_server(relay, path=str(socket_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    async with server:
        with open("/dev/full", "wb") as full:  # every write fails: ENOSPC
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sync.transports.ssh",
                "--relay",
                str(socket_path),
                "peer",
                "rsync",
                "--server",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=full,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            _, stderr = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == EXIT_SSH_FAILED
    lines = stderr.decode().splitlines()
    assert any(line.startswith(f"{MARKER} connect: relay {socket_path}") for line in lines), lines
    assert "Traceback" not in stderr.decode()


async def test_a_relay_nobody_serves_is_one_marker_line_and_no_leaked_socket(
    tmp_path: Path,
) -> None:
    socket_path = tmp_path / "absent.sock"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-W", "default::ResourceWarning", "-m", "sync.transports.ssh",
        "--relay", str(socket_path), "peer", "rsync", "--server",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == EXIT_SSH_FAILED
    text = stderr.decode()
    assert text.startswith(f"{MARKER} connect: relay {socket_path}"), text
    assert "ResourceWarning" not in text, text
