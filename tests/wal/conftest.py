"""Fixtures of the wal tests: a WAL file in a temp directory and a log opened on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from wal import WalConfig, WriteAheadLog

# Timing constants shrunk so idle checkpoints and batching happen within a test.
FAST = WalConfig(max_batch_delay_ms=1.0, idle_checkpoint_s=0.05, op_timeout_s=20.0)


@pytest.fixture
def wal_path(tmp_path: Path) -> Path:
    return tmp_path / "node" / "wal.db"


@pytest.fixture
async def wal(wal_path: Path) -> AsyncIterator[WriteAheadLog]:
    async with WriteAheadLog(wal_path, config=FAST) as log:
        yield log
