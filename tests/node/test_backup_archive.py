"""The backup archive: any flipped byte, a foreign member, another node's archive or a file that
is no shoal backup is refused (exit 2, naming the member) before anything is written."""

from __future__ import annotations

import io
import sqlite3
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from node.backup import restore_archive, verify_archive
from node.backup.archive import ArchiveWriter
from node.backup.snapshot import BackupSources, plan_databases, write_backup
from node.cli.app import app
from node.errors import ArchiveError

runner = CliRunner()


def make_archive(path: Path, node_id: str = "n1", extra: bytes = b"x" * 700) -> Path:
    with path.open("wb") as f:
        writer = ArchiveWriter(f)
        writer.add_bytes("node_id", f"{node_id}\n".encode())
        writer.add_bytes("jobs/j-1/spec.json", b'{"argv": ["true"]}')
        writer.add_bytes("games/games.db", extra)
        writer.finish(node_id, "c", 1.0, "0.test")
    return path


def restore_cli(archive: Path, data_dir: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["restore", str(archive), "--data-dir", str(data_dir)])
    return result.exit_code, result.output


def test_an_archive_restores_member_by_member(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar")
    code, output = restore_cli(archive, tmp_path / "data")
    assert code == 0, output
    assert (tmp_path / "data" / "node_id").read_text() == "n1\n"
    assert (tmp_path / "data" / "jobs" / "j-1" / "spec.json").read_bytes() == b'{"argv": ["true"]}'
    assert (tmp_path / "data" / "backup" / "MANIFEST.json").exists()


def test_every_flipped_byte_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar")
    original = archive.read_bytes()
    damaged = tmp_path / "damaged.tar"
    target = tmp_path / "data"
    for position in range(len(original)):  # headers, contents, padding, manifest, tar end
        flipped = bytearray(original)
        flipped[position] ^= 0x01
        damaged.write_bytes(bytes(flipped))
        with pytest.raises(ArchiveError):
            restore_archive(damaged, target)
        assert not target.exists(), f"byte {position}: something was written"


def test_the_cli_refuses_a_damaged_archive_with_exit_2_naming_the_member(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar")
    data = bytearray(archive.read_bytes())
    at = data.index(b"x" * 700)
    data[at + 10] ^= 0xFF
    archive.write_bytes(bytes(data))
    code, output = restore_cli(archive, tmp_path / "data")
    assert code == 2
    assert "games/games.db" in output
    assert "nothing written" in output
    assert not (tmp_path / "data").exists()


def test_a_tar_that_is_no_shoal_backup_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.tar"
    with tarfile.open(foreign, "w") as tar:
        info = tarfile.TarInfo("etc/passwd")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"root"))
    code, output = restore_cli(foreign, tmp_path / "data")
    assert code == 2
    assert "MANIFEST.json" in output
    (tmp_path / "text").write_text("hello")
    code, output = restore_cli(tmp_path / "text", tmp_path / "data")
    assert code == 2
    assert "MANIFEST.json" in output
    assert not (tmp_path / "data").exists()


def test_a_member_the_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar")
    spliced = tmp_path / "spliced.tar"
    with (
        tarfile.open(archive) as source,
        tarfile.open(spliced, "w", format=tarfile.USTAR_FORMAT) as out,
    ):
        for info in source.getmembers():
            if info.name == "MANIFEST.json":
                extra = tarfile.TarInfo("jobs/evil/spec.json")
                extra.size = 2
                out.addfile(extra, io.BytesIO(b"{}"))
            out.addfile(info, source.extractfile(info))
    with pytest.raises(ArchiveError) as caught:
        verify_archive(spliced)
    assert caught.value.member == "jobs/evil/spec.json"


def test_another_nodes_archive_is_refused_for_a_data_dir_of_this_node(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar", node_id="n2")
    target = tmp_path / "data"
    target.mkdir()
    (target / "node_id").write_text("n1\n")
    code, output = restore_cli(archive, target)
    assert code == 2
    assert "node_id" in output
    assert "'n2'" in output
    assert "'n1'" in output
    assert sorted(p.name for p in target.iterdir()) == ["node_id"]


def test_a_node_id_member_of_another_node_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    with archive.open("wb") as f:
        writer = ArchiveWriter(f)
        writer.add_bytes("node_id", b"n2\n")
        writer.finish("n1", "c", 1.0, "0.test")
    with pytest.raises(ArchiveError) as caught:
        verify_archive(archive)
    assert caught.value.member == "node_id"


def test_a_restore_never_replaces_a_file(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar")
    target = tmp_path / "data"
    (target / "games").mkdir(parents=True)
    (target / "games" / "games.db").write_bytes(b"mine")
    code, output = restore_cli(archive, target)
    assert code == 2
    assert "games/games.db" in output
    assert (target / "games" / "games.db").read_bytes() == b"mine"
    assert not (target / "node_id").exists()


def test_the_snapshot_finds_every_database_outside_synced_files_and_job_work(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    for relative in (
        "wal/wal.db",
        "sync/tombstones.db",
        "results/index.db",
        "models/user.db",
        "jobs/j-1/work/app.db",
    ):
        (data / relative).parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(data / relative) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE t (x)")
            conn.execute("INSERT INTO t VALUES (1)")
        conn.close()
    sources = BackupSources(
        node_id="n1",
        cluster="c",
        version="0.test",
        data_dir=data,
        wal_path=data / "wal" / "wal.db",
        store_paths={},
        file_roots={"models": data / "models"},
        config_json=b"{}",
    )
    assert set(plan_databases(sources)) == {"wal/wal.db", "sync/tombstones.db", "results/index.db"}
    staging = tmp_path / "staging"
    staging.mkdir()
    write_backup(sources, staging, tmp_path / "b.tar", 5.0, 1.0, lambda name, done: None)
    result = restore_archive(tmp_path / "b.tar", tmp_path / "restored")
    assert "results/index.db" in result.written
    with sqlite3.connect(tmp_path / "restored" / "results" / "index.db") as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    conn.close()
