"""Fetching one result file of a run's job from its member node into the results store: the
body of `POST /v1/results/fetch`, its checks, and the download."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from net import PeerClient, PeerRequestError
from node.errors import BodyError, RunError
from node.openapi import BODY_CONFIG, check_body
from node.runs.results import (
    LocalResults,
    NodeResults,
    ResultsStore,
    StoredResultJson,
    check_key,
    result_key,
)

CHUNK_BYTES = 1 << 20
JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")


@dataclass(frozen=True)
class Member:
    """Where a run's job (or one member of its gang) ran: its node, the node's URL, its job."""

    node: str
    url: str
    job_id: str


class FetchBody(BaseModel):
    """Body of `POST /v1/results/fetch`: the member node, its job, the path in the job's
    directory, and the results key (`runs/<run>/<node>/<path>`) to store it at."""

    model_config = BODY_CONFIG

    key: str = Field(min_length=1, description="runs/<run_id>/<node>/<path>")
    node: str = Field(min_length=1, description="the member node holding the file")
    job_id: str = Field(
        min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$", description="its job"
    )
    path: str = Field(min_length=1, description="the file's path in the job's directory")


def check_results_node(runtime: Any, results: ResultsStore | NodeResults) -> LocalResults:
    """The results node's own store, to fetch into; RunError 409 on any other node (only the
    results node stores results from the members itself)."""
    if runtime.settings.results.node != runtime.node_id or not isinstance(results, LocalResults):
        raise RunError(
            409,
            "not_results_node",
            f"node {runtime.node_id} is not the results node "
            f"({runtime.settings.results.node or 'none: the coordinator stores results'})",
        )
    return results


def parse_fetch(body: Any) -> FetchBody:
    """The fetch asked by `body`, its key that of its node and path; RunError 400 otherwise."""
    try:
        fetch = check_body(FetchBody, body)
    except BodyError as exc:
        raise RunError(400, "invalid_fetch", exc.reason) from None
    key = check_key(fetch.key)
    node, job_id, path = fetch.node, fetch.job_id, fetch.path
    if not JOB_ID.fullmatch(job_id):
        raise RunError(400, "invalid_fetch", f"job_id {job_id!r}: letters, digits, . _ -")
    if key != result_key(key.split("/")[1], node, path):
        raise RunError(400, "invalid_fetch", f"key {key!r} is not runs/<run>/{node}/{path}")
    return fetch


async def download_result(
    peers: PeerClient,
    store: ResultsStore,
    key: str,
    member_url: str,
    job_id: str,
    path: str,
) -> StoredResultJson:
    """Download `path` of the job `job_id` from `member_url` into `store` at `key`; the
    stored record, or {"missing": true} when the member has no such file."""
    files = f"/v1/jobs/{job_id}/files"
    url = f"{member_url}{files}"
    try:
        async with peers.stream(
            "GET", member_url, files, params={"path": path}, check=False
        ) as response:
            if response.status == 404:
                return StoredResultJson(key=key, missing=True)
            if response.status != 200:
                raise RunError(
                    502, "result_download_failed", f"{url}?path={path}: {response.status}"
                )
            return await store.put(
                key,
                response.iter_chunks(CHUNK_BYTES),
                response.headers.get("X-Shoal-Content-Hash"),
            )
    except (PeerRequestError, TimeoutError) as exc:
        raise RunError(502, "result_download_failed", f"{url}?path={path}: {exc!r}") from exc
