"""Finding 1: a job's `cwd` with `..` must not reach a directory outside the job's work dir
(the launcher makes it and, with `jobs.run_as`, gives it to the job's user as root)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.jobs.launcher import make_cwd
from node.jobs.records import JobError, parse_job_request
from node.jobs.store import JobStore
from tests.node.jobs.helpers import job_daemon


@pytest.fixture
def traversable_dir() -> Iterator[Path]:
    """A temp dir other users may traverse (pytest's own are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="shoal-cwd-escape-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_job_cwd_escape_with_dotdot_is_refused_and_chowns_nothing(
    traversable_dir: Path,
) -> None:
    outside = traversable_dir / "outside"
    outside.mkdir()
    owner = outside.stat().st_uid, outside.stat().st_gid
    flags = {"jobs.run_as": "nobody"} if os.geteuid() == 0 else None
    escape = "../" * 16 + str(outside).lstrip("/")
    async with job_daemon(traversable_dir, flags) as client:
        status, body = await client.call("POST", "/v1/jobs", json={"argv": ["true"], "cwd": escape})
        assert status == 400, body
        assert body["error"] == "invalid_job"
        assert "'..'" in body["reason"]
        status, body = await client.call(
            "POST", "/v1/jobs", json={"argv": ["true"], "cwd": "sub/../../x"}
        )
        assert status == 400, body
        inside = await client.wait((await client.start(["pwd"], cwd="a/b"))["job_id"])
        assert inside["state"] == "succeeded", inside
    assert (outside.stat().st_uid, outside.stat().st_gid) == owner
    assert not (outside / "x").exists()


def test_job_cwd_escape_through_a_symlink_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = JobStore(tmp_path / "jobs", "n1")
    store.open()
    entry = store.create(
        parse_job_request({"job_id": "j1", "argv": ["true"], "cwd": "link/sub"}), time.time()
    )
    entry.work_dir.mkdir(exist_ok=True)
    (entry.work_dir / "link").symlink_to(outside)
    with pytest.raises(PermissionError, match=r"not a directory of its own"):
        make_cwd(entry)
    assert not (outside / "sub").exists()
    plain = store.create(
        parse_job_request({"job_id": "j2", "argv": ["true"], "cwd": "a/./b"}), time.time()
    )
    cwd, made = make_cwd(plain)
    assert cwd == plain.work_dir / "a" / "b"
    assert made == [plain.work_dir, cwd]


def test_job_cwd_escape_is_refused_by_the_request_check() -> None:
    for cwd in ("..", "../x", "a/../../b", "/srv/../etc", "a/.."):
        with pytest.raises(JobError, match=r"'\.\.' segment"):
            parse_job_request({"argv": ["true"], "cwd": cwd})
    for cwd in ("a", "./a", "..a/b..", "/srv/data", ".hidden"):
        assert parse_job_request({"argv": ["true"], "cwd": cwd}).cwd == cwd
