"""Checks before a node starts: the data dir exists, is a directory and takes a durable write."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from node.errors import StartupError, data_dir_error
from sync import free_bytes

PROBE_BYTES = 64 * 1024
"""What the probe writes: a data dir without room for this cannot hold a WAL page either."""


def prepare_data_dir(data_dir: Path) -> None:
    """Create `data_dir` and prove it takes a durable write, or raise StartupError whose one line
    says which: a file in the way, not writable, read-only, or a full disk."""
    try:
        if data_dir.exists() and not data_dir.is_dir():
            raise StartupError(
                f"data dir {data_dir} is a file, not a directory; move it away or choose another "
                "--data-dir"
            )
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise data_dir_error(exc, data_dir) from exc
    probe = data_dir / f".shoal-write-probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = memoryview(b"\0" * PROBE_BYTES)
            while data:  # a short write means the disk filled: the next one says ENOSPC
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise data_dir_error(exc, data_dir, free_bytes(data_dir)) from exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
