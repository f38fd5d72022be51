"""fsync_directory, the one helper every package uses to make a create or rename durable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from config import fsync_directory, load_or_create_node_id


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Inodes of what os.fsync is called on, calling the real one too."""
    synced: list[int] = []
    real = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return synced


def test_fsync_directory_syncs_that_directory_and_refuses_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = record_fsyncs(monkeypatch)
    fsync_directory(tmp_path)
    assert synced == [tmp_path.stat().st_ino]
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(NotADirectoryError):
        fsync_directory(plain)


def test_a_new_node_id_is_durable_in_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = record_fsyncs(monkeypatch)
    node_id = load_or_create_node_id(tmp_path / "data")
    assert (tmp_path / "data" / "node_id").read_text().strip() == node_id
    assert synced[-1] == (tmp_path / "data").stat().st_ino
