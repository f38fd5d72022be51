"""Damaged files: a torn -wal tail opens with every acknowledged entry; foreign or corrupt
files raise WalCorruptError naming the file and are never re-created; move_aside."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.wal.conftest import FAST
from wal import WalConfig, WalCorruptError, WalError, WriteAheadLog, move_aside

# Entry types of the caller's own (shoal writes only sync_started and sync_completed).
GAME_RECORDED = "game_recorded"

# No checkpoint of any kind, so every commit stays in the -wal file until close.
NO_CHECKPOINT = WalConfig(
    wal_autocheckpoint_pages=0, checkpoint_interval_s=3600, idle_checkpoint_s=3600
)


def sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def integrity(path: Path) -> str:
    with closing(sqlite3.connect(path)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


async def crashed_copy(source: Path, target: Path) -> tuple[list[int], list[int], int]:
    """Log entries in two phases and copy db + -wal while the log is open (as after a crash).

    Returns the ids of phase A, of phase B, and the -wal size after phase A.
    """
    async with WriteAheadLog(source, config=NO_CHECKPOINT) as wal:
        phase_a = list(
            await asyncio.gather(*(wal.append(GAME_RECORDED, {"a": n}) for n in range(50)))
        )
        size_after_a = (await wal.stats()).wal_file_bytes
        phase_b: list[int] = []
        for round_ in range(8):
            batch = [wal.append(GAME_RECORDED, {"b": round_, "pad": "x" * 500}) for _ in range(10)]
            phase_b += await asyncio.gather(*batch)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        shutil.copyfile(sidecar(source, "-wal"), sidecar(target, "-wal"))
    return phase_a, phase_b, size_after_a


def truncate_to(path: Path, size: int) -> None:
    os.truncate(path, size)


def zero_from(path: Path, offset: int) -> None:
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(b"\0" * (size - offset))


@pytest.mark.parametrize(
    "damage",
    ["truncate_middle", "truncate_unaligned", "truncate_to_phase_a", "zero_tail", "zero_last_kb"],
)
async def test_torn_wal_tail_keeps_everything_acknowledged_before_it(
    tmp_path: Path, damage: str
) -> None:
    copy = tmp_path / "copy" / "wal.db"
    phase_a, phase_b, size_a = await crashed_copy(tmp_path / "live" / "wal.db", copy)
    wal_file = sidecar(copy, "-wal")
    size = wal_file.stat().st_size
    assert size > size_a
    middle = size_a + (size - size_a) // 2
    if damage == "truncate_middle":
        truncate_to(wal_file, middle)
    elif damage == "truncate_unaligned":
        truncate_to(wal_file, size_a + 777)
    elif damage == "truncate_to_phase_a":
        truncate_to(wal_file, size_a)
    elif damage == "zero_tail":
        zero_from(wal_file, middle)
    else:
        zero_from(wal_file, size - 1024)

    async with WriteAheadLog(copy, config=FAST) as wal:
        present = [e.id for e in await wal.pending()]
        assert set(phase_a) <= set(present)
        # Whole transactions survive or vanish: the ids left are exactly 1..k.
        assert present == list(range(1, len(present) + 1))
        assert len(present) < len(phase_a) + len(phase_b)
        for entry in await wal.pending():
            assert entry.payload.get("a", entry.payload.get("b")) is not None
        assert await wal.append(GAME_RECORDED, {}) == len(present) + 1
    assert integrity(copy) == "ok"


async def test_an_undamaged_crashed_copy_has_every_entry(tmp_path: Path) -> None:
    copy = tmp_path / "copy" / "wal.db"
    phase_a, phase_b, _ = await crashed_copy(tmp_path / "live" / "wal.db", copy)
    async with WriteAheadLog(copy, config=FAST) as wal:
        assert [e.id for e in await wal.pending()] == sorted(phase_a + phase_b)
    assert integrity(copy) == "ok"


def assert_names_file_and_fix(exc: WalCorruptError, path: Path) -> None:
    message = str(exc)
    assert str(path) in message
    assert "move-aside" in message
    assert exc.path == path


async def test_another_sqlite_database_is_not_a_wal(wal_path: Path) -> None:
    wal_path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(wal_path)) as conn:
        conn.execute("CREATE TABLE games (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO games VALUES (1)")
        conn.commit()
    with pytest.raises(WalCorruptError, match="not a shoal WAL") as caught:
        async with WriteAheadLog(wal_path, config=FAST):
            pass
    assert_names_file_and_fix(caught.value, wal_path)
    with closing(sqlite3.connect(wal_path)) as conn:
        assert conn.execute("SELECT id FROM games").fetchall() == [(1,)]


async def test_a_foreign_application_id_is_not_a_wal(wal_path: Path) -> None:
    wal_path.parent.mkdir(parents=True)
    conn = sqlite3.connect(wal_path)
    conn.execute("PRAGMA application_id = 12345")
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(WalCorruptError, match="application_id is 0x3039") as caught:
        await WriteAheadLog(wal_path, config=FAST).open()
    assert_names_file_and_fix(caught.value, wal_path)


async def test_a_file_that_is_not_sqlite_is_refused(wal_path: Path) -> None:
    wal_path.parent.mkdir(parents=True)
    wal_path.write_bytes(os.urandom(8192))
    with pytest.raises(WalCorruptError, match="not an SQLite database") as caught:
        await WriteAheadLog(wal_path, config=FAST).open()
    assert_names_file_and_fix(caught.value, wal_path)
    assert wal_path.stat().st_size == 8192


async def test_a_corrupt_page_fails_the_check_on_open(wal_path: Path) -> None:
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        await asyncio.gather(*(wal.append(GAME_RECORDED, {"pad": "y" * 300}) for _ in range(400)))
    page_size = 4096
    assert wal_path.stat().st_size > 10 * page_size
    with wal_path.open("r+b") as f:
        f.seek(5 * page_size)
        f.write(b"\xab" * page_size)
    with pytest.raises(WalCorruptError) as caught:
        await WriteAheadLog(wal_path, config=FAST).open()
    assert_names_file_and_fix(caught.value, wal_path)


async def test_a_missing_database_beside_its_wal_file_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "copy" / "wal.db"
    await crashed_copy(tmp_path / "live" / "wal.db", copy)
    copy.unlink()
    with pytest.raises(WalCorruptError, match="database is missing") as caught:
        await WriteAheadLog(copy, config=FAST).open()
    assert_names_file_and_fix(caught.value, copy)
    assert not copy.exists()


async def test_a_newer_schema_version_is_refused_without_calling_it_corrupt(
    wal_path: Path,
) -> None:
    async with WriteAheadLog(wal_path, config=FAST):
        pass
    conn = sqlite3.connect(wal_path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(WalError, match="schema version 99") as caught:
        await WriteAheadLog(wal_path, config=FAST).open()
    assert not isinstance(caught.value, WalCorruptError)


async def test_an_empty_file_becomes_a_new_wal(wal_path: Path) -> None:
    wal_path.parent.mkdir(parents=True)
    wal_path.touch()
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        assert await wal.append(GAME_RECORDED, {}) == 1


async def test_a_database_killed_while_being_created_becomes_a_new_wal(wal_path: Path) -> None:
    wal_path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(wal_path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        assert await wal.append(GAME_RECORDED, {}) == 1


async def test_move_aside_renames_the_set_and_a_new_wal_starts(wal_path: Path) -> None:
    wal_path.parent.mkdir(parents=True)
    wal_path.write_bytes(b"garbage" * 100)
    sidecar(wal_path, "-wal").write_bytes(b"w")
    sidecar(wal_path, "-shm").write_bytes(b"s")
    with pytest.raises(WalCorruptError):
        await WriteAheadLog(wal_path, config=FAST).open()
    moved = move_aside(wal_path)
    assert moved.parent == wal_path.parent
    assert moved.name.startswith("wal.db.corrupt-")
    assert moved.read_bytes() == b"garbage" * 100
    assert sidecar(moved, "-wal").read_bytes() == b"w"
    assert sidecar(moved, "-shm").read_bytes() == b"s"
    assert not wal_path.exists()
    assert not sidecar(wal_path, "-wal").exists()
    wal_path.write_bytes(b"again")
    second = move_aside(wal_path)
    assert second != moved
    async with WriteAheadLog(wal_path, config=FAST) as wal:
        assert await wal.append(GAME_RECORDED, {}) == 1


async def test_move_aside_refuses_an_open_log_and_a_missing_file(wal: WriteAheadLog) -> None:
    with pytest.raises(WalError, match="open in this process"):
        move_aside(wal.path)
    with pytest.raises(WalError, match="nothing to move aside"):
        move_aside(wal.path.with_name("absent.db"))
