"""Storage providers from /proc/mounts, their capabilities, and shared-storage identity."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sync.storage import (
    MARKER_NAME,
    MountInfo,
    StorageKind,
    classify,
    detect_storage,
    ensure_marker,
    mount_for,
    parse_mounts,
    read_mounts,
    shared_id,
    shares_storage,
)

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
filer:/export/models /mnt/shared nfs4 rw,vers=4.2 0 0
//nas/share /mnt/cifs cifs rw 0 0
s3fs /mnt/bucket fuse.s3fs rw 0 0
tmpfs /dev/shm tmpfs rw 0 0
overlay /scratch overlay rw 0 0
/dev/vdb /mnt/shared/local\\040disk xfs rw 0 0
garbage
"""


def test_parse_mounts_unescapes_and_skips_garbage() -> None:
    mounts = parse_mounts(MOUNTS)
    assert len(mounts) == 8
    assert mounts[2] == MountInfo("filer:/export/models", "/mnt/shared", "nfs4")
    assert mounts[7].mount_point == "/mnt/shared/local disk"


def test_classify() -> None:
    for fs_type in ["nfs", "nfs4", "cifs", "fuse.s3fs", "fuse.sshfs"]:
        assert classify(fs_type) is StorageKind.NFS
    for fs_type in ["tmpfs", "overlay"]:
        assert classify(fs_type) is StorageKind.EPHEMERAL
    for fs_type in ["ext4", "xfs", "btrfs", "zfs"]:
        assert classify(fs_type) is StorageKind.LOCAL


def test_mount_for_picks_the_longest_mount_point() -> None:
    mounts = parse_mounts(MOUNTS)
    assert mount_for(Path("/mnt/shared/ckpt"), mounts).fs_type == "nfs4"
    assert mount_for(Path("/mnt/shared/local disk/x"), mounts).fs_type == "xfs"
    assert mount_for(Path("/mnt/sharedx"), mounts).fs_type == "ext4"
    assert mount_for(Path("/scratch"), mounts).fs_type == "overlay"
    assert mount_for(Path("/x"), []).fs_type == "unknown"


def test_providers_group_categories_by_mount() -> None:
    mounts = parse_mounts(MOUNTS)
    paths = {
        "models": Path("/mnt/shared/models"),
        "training": Path("/mnt/shared/training"),
        "configs": Path("/scratch/configs"),
    }
    providers = {p.kind: p for p in detect_storage(paths, mounts)}
    assert set(providers) == {StorageKind.NFS, StorageKind.EPHEMERAL}
    nfs = providers[StorageKind.NFS]
    assert nfs.get_paths() == {"models": paths["models"], "training": paths["training"]}
    assert nfs.get_capabilities().shared
    assert not providers[StorageKind.EPHEMERAL].get_capabilities().persistent
    assert detect_storage({"m": Path("/")}, [MountInfo("/dev/x", "/", "ext4")])[0].kind == "local"


def test_this_hosts_mounts_are_readable() -> None:
    assert any(mount.mount_point == "/" for mount in read_mounts())


async def test_marker_is_created_once_even_by_racing_nodes(tmp_path: Path) -> None:
    ids = await asyncio.gather(*(asyncio.to_thread(ensure_marker, tmp_path) for _ in range(8)))
    assert len(set(ids)) == 1
    assert (tmp_path / MARKER_NAME).read_text().strip() == ids[0]
    assert [p.name for p in tmp_path.iterdir()] == [MARKER_NAME]


def test_shared_id_only_for_shared_storage(tmp_path: Path) -> None:
    nfs = [MountInfo("filer:/x", str(tmp_path), "nfs4")]
    local = [MountInfo("/dev/vda", str(tmp_path), "ext4")]
    paths = {"models": tmp_path}
    shared = shared_id(detect_storage(paths, nfs)[0], tmp_path)
    assert shared is not None
    assert shared.startswith("filer:/x|")
    assert shared_id(detect_storage(paths, local)[0], tmp_path) is None
    assert shared_id(None, tmp_path) is None
    assert shares_storage(shared, shared)
    assert not shares_storage(None, None)
    assert not shares_storage(shared, "filer:/x|other")
