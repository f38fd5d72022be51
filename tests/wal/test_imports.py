"""The wal package imports alone, exports its contract, and imports nothing above it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import wal

REPO = Path(__file__).resolve().parents[2]
CONTRACT = {
    "WriteAheadLog",
    "WalEntry",
    "WalConfig",
    "WalStats",
    "WalError",
    "WalFullError",
    "WalCorruptError",
    "WalObserver",
    "RecoveryResult",
    "EntryState",
    "SYNC_STARTED",
    "SYNC_COMPLETED",
    "BUILTIN_ENTRY_TYPES",
    "move_aside",
}


def test_wal_imports_alone_without_upper_layers() -> None:
    code = (
        "import sys, wal\n"
        "upper = sorted(m for m in sys.modules if m.split('.')[0] in {'health', 'sync', 'node'})\n"
        "assert not upper, upper\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_all_exports_the_contract() -> None:
    assert set(wal.__all__) >= CONTRACT
    assert all(hasattr(wal, name) for name in wal.__all__)
    assert issubclass(wal.WalFullError, wal.WalError)
    assert issubclass(wal.WalCorruptError, wal.WalError)
    assert {"sync_started", "sync_completed"} == wal.BUILTIN_ENTRY_TYPES
    assert {s.value for s in wal.EntryState} == {"pending", "committed", "rolled_back", "failed"}


def test_config_defaults() -> None:
    config = wal.WalConfig()
    assert (config.max_batch, config.max_batch_delay_ms, config.max_pending) == (1024, 2.0, 100_000)
    assert (config.max_payload_bytes, config.max_retries) == (1 << 20, 5)
    assert (config.busy_timeout_s, config.checkpoint_interval_s) == (5.0, 30)


def test_config_waits_come_from_the_timeout_table() -> None:
    from config import Timeouts

    timeouts = Timeouts(sqlite_busy_s=1.5, wal_op_s=7.0, wal_open_s=40.0)
    config = wal.WalConfig.from_timeouts(timeouts, max_batch=8)
    assert (config.busy_timeout_s, config.op_timeout_s, config.open_timeout_s) == (1.5, 7.0, 40.0)
    assert config.max_batch == 8
    default = wal.WalConfig.from_timeouts(Timeouts())
    assert (default.busy_timeout_s, default.op_timeout_s) == (Timeouts().sqlite_busy_s, 30.0)


@pytest.mark.parametrize(
    "bad", [{"max_batch": 0}, {"busy_timeout_s": 0.0}, {"max_batch_delay_ms": -1.0}]
)
def test_config_refuses_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        wal.WalConfig(**bad)  # type: ignore[arg-type]
