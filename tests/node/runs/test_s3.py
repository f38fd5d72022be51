"""The s3 results store against moto in server mode on 127.0.0.1: single and multipart
uploads checked after upload, a wrong hash refused, and a run's results landing in the bucket."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.session import get_session  # type: ignore[import-untyped]
from moto.server import ThreadedMotoServer

from node.errors import ResultsStoreError
from node.runs.s3 import S3Results
from tests.node.runs.cluster import post, running
from tests.node.runs.test_runs_cluster import wait_done

BUCKET = "results"
MIB = 1 << 20


@pytest.fixture
def s3_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    path = tmp_path / "s3.ini"
    path.write_text("[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    return path


def s3_client(url: str) -> Any:
    return get_session().create_client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


async def make_bucket(url: str) -> None:
    async with s3_client(url) as client:
        await client.create_bucket(Bucket=BUCKET)


async def read_object(url: str, key: str) -> bytes:
    async with s3_client(url) as client:
        answer = await client.get_object(Bucket=BUCKET, Key=key)
        async with answer["Body"] as body:
            data: bytes = await body.read()
            return data


async def chunks_of(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), MIB):
        yield data[start : start + MIB]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_small_and_multipart_uploads_are_checked_after_upload(
    s3_url: str, credentials: Path, tmp_path: Path
) -> None:
    await make_bucket(s3_url)
    store = S3Results(s3_url, BUCKET, "team", credentials, tmp_path / "staging", part_bytes=5 * MIB)
    small = b"a checkpoint\n"
    done = await store.put("runs/r1/n1/out.txt", chunks_of(small), sha(small))
    assert done["store"] == f"s3://{BUCKET}/team/runs/r1/n1/out.txt"
    assert await read_object(s3_url, "team/runs/r1/n1/out.txt") == small
    large = bytes(range(256)) * (11 * MIB // 256 + 1)
    done = await store.put("runs/r1/n1/model.bin", chunks_of(large), None)
    assert done["etag"].endswith("-3")
    assert done["sha256"] == sha(large)
    assert await read_object(s3_url, "team/runs/r1/n1/model.bin") == large
    assert list((tmp_path / "staging").iterdir()) == []


async def test_a_wrong_hash_is_refused_and_nothing_is_stored(
    s3_url: str, credentials: Path, tmp_path: Path
) -> None:
    await make_bucket(s3_url)
    store = S3Results(s3_url, BUCKET, "", credentials, tmp_path / "staging")
    with pytest.raises(ResultsStoreError) as caught:
        await store.put("runs/r/n/x", chunks_of(b"data"), sha(b"other"))
    assert caught.value.code == "result_hash_mismatch"
    async with s3_client(s3_url) as client:
        listing = await client.list_objects_v2(Bucket=BUCKET, Prefix="runs/r/n/")
    assert listing.get("KeyCount", 0) == 0


async def test_missing_bucket_is_an_error_not_a_success(
    s3_url: str, credentials: Path, tmp_path: Path
) -> None:
    store = S3Results(s3_url, "no-such-bucket", "", credentials, tmp_path / "staging")
    with pytest.raises(ResultsStoreError) as caught:
        await store.put("runs/r/n/x", chunks_of(b"data"), sha(b"data"))
    assert caught.value.code == "results_store_failed"


async def test_a_run_puts_its_results_in_the_bucket(
    s3_url: str, credentials: Path, tmp_path: Path
) -> None:
    await make_bucket(s3_url)
    flags = {
        "results.backend": "s3",
        "results.endpoint_url": s3_url,
        "results.bucket": BUCKET,
        "results.prefix": "shoal",
        "results.credentials_file": credentials,
    }
    code = "open('out.txt', 'w').write('weights')"
    async with running(tmp_path, **flags) as cluster:
        body = {"argv": [sys.executable, "-c", code], "nodes": 2, "results": ["out.txt"]}
        status, record = await post(f"{cluster.urls[0]}/v1/runs", body)
        assert status == 201
        done = await wait_done(cluster, record["run_id"], 60)
    assert done["state"] == "succeeded"
    assert len(done["uploaded"]) == 2
    for upload in done["uploaded"]:
        key = f"shoal/runs/{record['run_id']}/{upload['node']}/out.txt"
        assert upload["store"] == f"s3://{BUCKET}/{key}"
        assert await read_object(s3_url, key) == b"weights"
        assert upload["sha256"] == sha(b"weights")
