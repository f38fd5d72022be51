"""Item 13: a restore verifies every byte of the archive, then writes its members; an archive
changed on disk between the two (a copy still arriving, someone else's write) must be refused
naming the member, and that member must not be put in place."""

from __future__ import annotations

from pathlib import Path

import pytest

import node.backup.restore
from node.backup.archive import VerifiedArchive
from node.errors import ArchiveError
from tests.node.test_backup_archive import make_archive

CONTENT = b"x" * 700


def test_restore_archive_changed_on_disk_while_restored_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = make_archive(tmp_path / "a.tar", extra=CONTENT)
    verify = node.backup.restore.verify_archive

    def verify_then_change(path: Path, progress: object = None) -> VerifiedArchive:
        verified = verify(path, None)
        raw = bytearray(path.read_bytes())
        at = raw.index(CONTENT)
        raw[at : at + 4] = b"EVIL"  # same size: the tar still reads, the content differs
        path.write_bytes(bytes(raw))
        return verified

    monkeypatch.setattr(node.backup.restore, "verify_archive", verify_then_change)
    data = tmp_path / "data"
    with pytest.raises(ArchiveError, match="changed on disk while it was restored") as caught:
        node.backup.restore.restore_archive(archive, data)
    assert caught.value.member == "games/games.db"
    assert not (data / "games" / "games.db").exists(), "the changed member was put in place"
    assert not list((data / "games").glob(".*restoring")), "its temporary file was left"
