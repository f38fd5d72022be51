"""A consistent snapshot of a running node's data dir: every SQLite database (WAL, record stores,
tombstones, manifest caches, lock table) copied with SQLite's online backup API in page steps,
the job records, the node id, its config and the list of synced files, written as one archive.

All databases are WAL-mode files: a read transaction opened on each before any copy starts fixes
one cut across them, and writers keep committing beside it (a WAL reader never blocks a writer),
so the node ingests and serves throughout."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node.backup.archive import NODE_ID_MEMBER, ArchiveWriter, Manifest, Progress
from node.errors import BackupError

SQLITE_HEADER = b"SQLite format 3\x00"
SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal")
STAGING_PREFIX = ".backup-"
PAGES_PER_STEP = 256
"""Pages copied per backup step; between steps other connections run freely."""
CONFIG_MEMBER = "backup/config.json"
FILES_MEMBER = "backup/files.json"
JOBS_DIR = "jobs"
JOB_SKIPPED = frozenset({"work", "tmp", "lock"})
"""Entries of a job directory that are not its record: its working and temp dirs, its lock."""


@dataclass(frozen=True)
class BackupSources:
    """What a backup of one node reads: where its files are and who it is."""

    node_id: str
    cluster: str
    version: str
    data_dir: Path
    wal_path: Path
    store_paths: Mapping[str, Path]
    """Record store name -> its database file."""
    file_roots: Mapping[str, Path]
    """Synced file category -> its directory (skipped by the database walk)."""
    config_json: bytes
    files: Sequence[Mapping[str, object]] = field(default=())
    """Every synced file: category, path, size, hash (the catalog's)."""
    with_files: bool = False


def is_sqlite_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def _default_store_name(store: str, path: Path, sources: BackupSources) -> str:
    if _inside(path, sources.data_dir):
        return path.resolve().relative_to(sources.data_dir.resolve()).as_posix()
    directory = store if store in sources.file_roots or store in ("games", "rollouts") else None
    return f"{directory or 'records'}/{path.name}"


def _walk(root: Path, skip: Callable[[Path], bool]) -> Iterator[Path]:
    """Regular files under `root`, sorted, not descending into directories `skip` names."""
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        dirs[:] = sorted(d for d in dirs if not skip(here / d))
        for name in sorted(files):
            path = here / name
            if path.is_file() and not path.is_symlink():
                yield path


def plan_databases(sources: BackupSources) -> dict[str, Path]:
    """Member name -> database file: the WAL, every record store, every other SQLite file of
    the data dir (outside the synced file categories and the jobs' working directories)."""
    planned: dict[str, Path] = {"wal/wal.db": sources.wal_path}
    for store, path in sorted(sources.store_paths.items()):
        if path.exists():
            planned[_default_store_name(store, path, sources)] = path
    known = {path.resolve() for path in planned.values()}
    roots = [root.resolve() for root in sources.file_roots.values()]

    def skip(directory: Path) -> bool:
        resolved = directory.resolve()
        return (
            directory.name.startswith(STAGING_PREFIX)
            or resolved in roots
            or (directory.name == "work" and directory.parent.parent.name == JOBS_DIR)
        )

    for path in _walk(sources.data_dir, skip):
        if path.name.endswith(SIDECAR_SUFFIXES) or path.resolve() in known:
            continue
        if is_sqlite_file(path):
            planned[path.relative_to(sources.data_dir).as_posix()] = path
    return planned


def plan_job_files(data_dir: Path) -> dict[str, Path]:
    """Member name -> file of every job's record (spec, launch, result, logs; not `work/`)."""
    root = data_dir / JOBS_DIR
    if not root.is_dir():
        return {}

    def skip(directory: Path) -> bool:
        return directory.name in JOB_SKIPPED and directory.parent.parent == root

    return {
        path.relative_to(data_dir).as_posix(): path
        for path in _walk(root, skip)
        if path.name not in JOB_SKIPPED
    }


def _open_cut(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """A read-only connection holding a read transaction: the snapshot this copy takes."""
    uri = f"file:{path}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def copy_databases(
    planned: Mapping[str, Path], staging: Path, busy_timeout_s: float, progress: Progress
) -> dict[str, Path]:
    """Copy every database at one cut into `staging`; member name -> copy."""
    copies: dict[str, Path] = {}
    cuts: list[tuple[str, sqlite3.Connection]] = []
    try:
        for name, path in planned.items():
            cuts.append((name, _open_cut(path, busy_timeout_s)))
        for index, (name, source) in enumerate(cuts):
            copy = staging / f"db-{index}.sqlite"
            with contextlib.closing(sqlite3.connect(copy, isolation_level=None)) as target:

                def step(status: int, remaining: int, total: int, name: str = name) -> None:
                    del status
                    progress(name, total - remaining)

                source.backup(target, pages=PAGES_PER_STEP, progress=step)
                problems = [str(row[0]) for row in target.execute("PRAGMA quick_check(5)")]
                if problems != ["ok"]:
                    raise BackupError(f"{planned[name]}: the copy fails its check: {problems}")
            for suffix in SIDECAR_SUFFIXES:
                Path(f"{copy}{suffix}").unlink(missing_ok=True)
            copies[name] = copy
    except sqlite3.Error as exc:
        raise BackupError(f"copying the databases failed: {exc}") from exc
    finally:
        for _, conn in cuts:
            conn.close()
    return copies


def write_backup(
    sources: BackupSources,
    staging: Path,
    out: Path,
    busy_timeout_s: float,
    created_at: float,
    progress: Progress,
) -> Manifest:
    """Take the snapshot into `staging` and write the archive to `out`. Blocking."""
    databases = copy_databases(plan_databases(sources), staging, busy_timeout_s, progress)
    try:
        with out.open("wb") as f:
            writer = ArchiveWriter(f, progress)
            writer.add_bytes(NODE_ID_MEMBER, f"{sources.node_id}\n".encode())
            writer.add_bytes(CONFIG_MEMBER, sources.config_json)
            files = json.dumps(list(sources.files), indent=1, sort_keys=True).encode()
            writer.add_bytes(FILES_MEMBER, files)
            for name, copy in databases.items():
                writer.add_file(name, copy)
            for name, path in plan_job_files(sources.data_dir).items():
                with contextlib.suppress(FileNotFoundError):  # a job removed meanwhile
                    writer.add_file(name, path)
            if sources.with_files:
                for entry in sources.files:
                    category, relative = str(entry["category"]), str(entry["path"])
                    path = sources.file_roots[category] / relative
                    with contextlib.suppress(FileNotFoundError):  # deleted since the listing
                        writer.add_file(f"{category}/{relative}", path)
            manifest = writer.finish(sources.node_id, sources.cluster, created_at, sources.version)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise BackupError(f"writing the archive {out} failed: {exc}") from exc
    return manifest
