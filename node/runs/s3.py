"""The results store of runs, `s3` backend: any S3-compatible store through aiobotocore. A file
is staged on local disk and checked against its node's hash, uploaded (multipart above one
part), then read back with HEAD: the store's ETag must equal the MD5 (or multipart MD5) computed
here and its sha256 metadata the file's. Only then is the upload reported done.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from node.errors import ResultsStoreError
from node.runs.results import StoredResultJson
from sync import DEFAULT_PIECE_SIZE
from sync.files.manifest import digest_of_fd

PART_BYTES = 8 << 20
"""Multipart part size (S3's minimum for every part but the last is 5 MiB)."""
SHA256_META = "sha256"


def read_credentials(path: Path, profile: str = "default") -> tuple[str, str]:
    """(access key id, secret key) from an AWS-style credentials file (INI, `[default]`)."""
    parser = configparser.ConfigParser()
    try:
        with path.open() as handle:
            parser.read_file(handle)
        section = parser[profile]
        return section["aws_access_key_id"], section["aws_secret_access_key"]
    except (OSError, KeyError, configparser.Error) as exc:
        raise ResultsStoreError(
            500,
            "bad_s3_credentials",
            f"results.credentials_file {path}: needs [{profile}] with aws_access_key_id and "
            f"aws_secret_access_key ({exc!r})",
        ) from exc


def _hashes(path: Path, part_bytes: int) -> tuple[int, str, str, str]:
    """(size, sync's content hash, sha256, the ETag S3 computes for this upload)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size, content_hash, _ = digest_of_fd(fd, DEFAULT_PIECE_SIZE)
    finally:
        os.close(fd)
    sha = hashlib.sha256()
    part_md5s: list[bytes] = []
    with path.open("rb") as handle:
        while chunk := handle.read(part_bytes):
            sha.update(chunk)
            part_md5s.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    if len(part_md5s) <= 1:
        single = part_md5s[0] if part_md5s else hashlib.md5(b"", usedforsecurity=False).digest()
        etag = single.hex()
    else:
        joined = hashlib.md5(b"".join(part_md5s), usedforsecurity=False).hexdigest()
        etag = f"{joined}-{len(part_md5s)}"
    return size, content_hash, sha.hexdigest(), etag


class S3Results:
    """Results in `bucket` under `prefix` at `endpoint_url`; files are staged under `staging`."""

    def __init__(
        self,
        endpoint_url: str,
        bucket: str,
        prefix: str,
        credentials_file: Path,
        staging: Path,
        *,
        region: str = "us-east-1",
        part_bytes: int = PART_BYTES,
        timeout_s: float = 60.0,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.credentials_file = credentials_file
        self.staging = staging
        self.region = region
        self.part_bytes = part_bytes
        self.timeout_s = timeout_s

    def object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    async def put(
        self, key: str, chunks: AsyncIterator[bytes], expected_hash: str | None
    ) -> StoredResultJson:
        """Stage, verify against `expected_hash`, upload, and check what the store holds."""
        temp = self.staging / key.replace("/", "__")
        await asyncio.to_thread(temp.parent.mkdir, parents=True, exist_ok=True)
        try:
            with temp.open("wb") as out:
                async for chunk in chunks:
                    await asyncio.to_thread(out.write, chunk)
            size, content_hash, sha256, etag = await asyncio.to_thread(
                _hashes, temp, self.part_bytes
            )
            if expected_hash is not None and content_hash != expected_hash:
                raise ResultsStoreError(
                    502,
                    "result_hash_mismatch",
                    f"{key}: received content hashes to {content_hash}, its node announced "
                    f"{expected_hash}",
                )
            object_key = self.object_key(key)
            await self._upload(temp, object_key, size, sha256, etag)
        except OSError as exc:
            raise ResultsStoreError(500, "results_store_failed", f"{key}: {exc}") from exc
        finally:
            temp.unlink(missing_ok=True)
        return StoredResultJson(
            key=key,
            size=size,
            hash=content_hash,
            sha256=sha256,
            etag=etag,
            store=f"s3://{self.bucket}/{object_key}",
        )

    async def _upload(self, path: Path, object_key: str, size: int, sha256: str, etag: str) -> None:
        access_key, secret_key = read_credentials(self.credentials_file)
        session = get_session()
        where = f"s3://{self.bucket}/{object_key} at {self.endpoint_url}"
        try:
            async with session.create_client(
                "s3",
                endpoint_url=self.endpoint_url,
                region_name=self.region,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
            ) as client:
                meta = {SHA256_META: sha256}
                if size <= self.part_bytes:
                    body = await asyncio.to_thread(path.read_bytes)
                    await asyncio.wait_for(
                        client.put_object(
                            Bucket=self.bucket, Key=object_key, Body=body, Metadata=meta
                        ),
                        self.timeout_s,
                    )
                else:
                    await self._multipart(client, path, object_key, meta)
                head = await asyncio.wait_for(
                    client.head_object(Bucket=self.bucket, Key=object_key), self.timeout_s
                )
        except (BotoCoreError, ClientError, TimeoutError) as exc:
            raise ResultsStoreError(502, "results_store_failed", f"{where}: {exc}") from exc
        stored_etag = str(head.get("ETag", "")).strip('"')
        stored_sha = dict(head.get("Metadata") or {}).get(SHA256_META)
        if stored_etag != etag or stored_sha != sha256 or int(head["ContentLength"]) != size:
            raise ResultsStoreError(
                502,
                "result_hash_mismatch",
                f"{where}: the store holds ETag {stored_etag}, sha256 {stored_sha}, "
                f"{head.get('ContentLength')} bytes; uploaded {etag}, {sha256}, {size} bytes",
            )

    async def _multipart(
        self, client: Any, path: Path, object_key: str, meta: dict[str, str]
    ) -> None:
        created = await client.create_multipart_upload(
            Bucket=self.bucket, Key=object_key, Metadata=meta
        )
        upload_id = created["UploadId"]
        parts = []
        try:
            with path.open("rb") as handle:
                number = 0
                while chunk := await asyncio.to_thread(handle.read, self.part_bytes):
                    number += 1
                    answer = await asyncio.wait_for(
                        client.upload_part(
                            Bucket=self.bucket,
                            Key=object_key,
                            UploadId=upload_id,
                            PartNumber=number,
                            Body=chunk,
                        ),
                        self.timeout_s,
                    )
                    parts.append({"ETag": answer["ETag"], "PartNumber": number})
            await asyncio.wait_for(
                client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=object_key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                ),
                self.timeout_s,
            )
        except BaseException:
            with contextlib.suppress(BotoCoreError, ClientError, TimeoutError):
                await asyncio.wait_for(
                    client.abort_multipart_upload(
                        Bucket=self.bucket, Key=object_key, UploadId=upload_id
                    ),
                    self.timeout_s,
                )
            raise
