"""The job HTTP API: start, list, get, wait, logs, kill, files and delete under /v1/jobs, each
declared on its handler. A JobError is answered by the node's error middleware in the one shape
`{"error": CODE, "reason": TEXT, "status": N}`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema

from config.declare import READ, Caller, Refusal, route, unset
from node.errors import JobError
from node.jobs.records import (
    JobRecord,
    JobStartBody,
    JobState,
    KillBody,
    parse_job_request,
    parse_kill,
)
from node.jobs.service import JobService
from node.jobs.store import STREAMS, JobEntry
from node.openapi import BINARY, WireRecord
from sync import DEFAULT_PIECE_SIZE, PathRefusedError, check_raw_query_value, open_inside
from sync.files.manifest import digest_of_fd

JOBS_PATH = "/v1/jobs"
JOB_PATH = "/v1/jobs/{job_id}"
HASH_HEADER = "X-Shoal-Content-Hash"
NEXT_OFFSET_HEADER = "X-Next-Offset"
START_OFFSET_HEADER = "X-Start-Offset"
FOLLOW_POLL_S = 0.02
READ_CHUNK_BYTES = 1 << 18
DEFAULT_WAIT_S = 30.0
TAIL_SCAN_BYTES = 1 << 16


class JobList(WireRecord):
    """The answer of `GET /v1/jobs`: this node's jobs, newest first."""

    jobs: tuple[JobRecord, ...]


class Deleted(WireRecord):
    """The answer of `DELETE /v1/jobs/{job_id}`."""

    job_id: str
    deleted: Literal[True] = True


class ListQuery(BaseModel):
    state: JobState | None = Field(default=None, description="only jobs in this state")


class WaitQuery(BaseModel):
    timeout_s: float = Field(
        default=DEFAULT_WAIT_S, ge=0, description="seconds to wait (default 30, max 600)"
    )


class LogsQuery(BaseModel):
    stream: Literal["stdout", "stderr"] = Field(
        default="stdout", description="stdout (default) or stderr"
    )
    offset: Annotated[float, Field(ge=0)] | SkipJsonSchema[None] = unset("first byte to send")
    tail: Annotated[float, Field(ge=0)] | SkipJsonSchema[None] = unset(
        "send the last N lines (without offset)"
    )
    follow: Literal["0", "1"] = Field(default="0", description="1: keep streaming until it ends")


class FilesQuery(BaseModel):
    path: str = Field(default="", description="relative path in the working directory")


StartFn = Callable[[object, Mapping[str, str]], Awaitable[tuple[JobRecord, bool]]]
"""Start a job from its request body (not yet parsed) and headers: its record, and whether it
was created (False: the same request again)."""
WORK = (Caller.FENCED, Caller.OPERATOR)
"""A node starts and kills jobs only as the coordinator's work (gang members, a run's job)."""
NO_JOB = Refusal(404, "job_not_found", "no such job")
BAD_QUERY = Refusal(400, "invalid_query", "a bad query parameter")


async def json_body(request: web.Request) -> Any:
    """The request's JSON body, or None when it is empty (read even after the auth check);
    JobError 400 invalid_json when it is not JSON."""
    raw = await request.read()
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError as exc:  # malformed JSON, or bytes that are not UTF-8
        raise JobError(400, "invalid_json", f"malformed JSON: {exc}") from None


def query_number(request: web.Request, name: str, default: float | None) -> float | None:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise JobError(400, "invalid_query", f"{name} must be a number, not {text!r}") from None
    if value < 0 or value != value:
        raise JobError(400, "invalid_query", f"{name} must be >= 0")
    return value


def tail_offset(path: os.PathLike[str] | str, lines: int, size: int) -> int:
    """The offset where the last `lines` lines of the file's first `size` bytes begin."""
    if lines <= 0:
        return size
    count = 0
    with open(path, "rb") as handle:
        position = size
        while position > 0:
            start = max(0, position - TAIL_SCAN_BYTES)
            handle.seek(start)
            block = handle.read(position - start)
            index = len(block)
            while (index := block.rfind(b"\n", 0, index)) >= 0:
                if start + index + 1 == size:
                    continue  # the newline that ends the last line
                count += 1
                if count == lines:
                    return start + index + 1
            position = start
    return 0


def read_at(path: os.PathLike[str] | str, offset: int, limit: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read(limit)
    except FileNotFoundError:
        return b""


class JobRoutes:
    """Handlers of the job API over one JobService; `start` may be replaced (gang jobs)."""

    def __init__(self, service: JobService, start: StartFn | None = None) -> None:
        self.service = service
        self.start: StartFn = start or self.start_single

    async def start_single(
        self, body: object, headers: Mapping[str, str]
    ) -> tuple[JobRecord, bool]:
        request = parse_job_request(body)
        if request.nodes != 1 or request.gang is not None:
            raise JobError(
                400, "gang_unavailable", "this node runs single-node jobs only (nodes: 1)"
            )
        entry, created = await self.service.start(request)
        return self.service.record(entry), created

    @route(
        "POST",
        JOBS_PATH,
        callers=WORK,
        answers=(
            (201, "the job, started"),
            (200, "the existing job with this job_id and the same spec"),
        ),
        errors=[
            Refusal(400, "invalid_job", "invalid request (argv a string, unknown field, ...)"),
            Refusal(400, "bad_local_rank", "env_from rendezvous with a LOCAL_RANK not run here"),
            Refusal(403, "program_not_allowed", "program not in jobs.allowed_programs"),
            Refusal(409, "job_id_conflict", "job_id exists with a different spec"),
            Refusal(409, "stale_fence", "a stale plan fence"),
            Refusal(409, "no_rendezvous", "env_from rendezvous without a rendezvous"),
            Refusal(409, "master_port_busy", "a gang's member 0 whose MASTER_PORT is in use"),
        ],
        body=JobStartBody,
        answer=JobRecord,
    )
    async def handle_start(self, request: web.Request) -> web.Response:
        """Start a job: {"job_id"?, "name", "argv": [...], "env"?, "cwd"?, "timeout_s"?,
        "nodes"?, "role"?, "env_from"?: "rendezvous"}; argv is a list, never a string"""
        body = await json_body(request)
        if not isinstance(body, dict):
            raise JobError(400, "invalid_job", "expected a JSON object with argv (a list)")
        record, created = await self.start(body, request.headers)
        return web.json_response(record.to_json(), status=201 if created else 200)

    @route(
        "GET",
        JOBS_PATH,
        callers=READ,
        answers=((200, '{"jobs": [record, ...]}'),),
        errors=[Refusal(400, "invalid_query", "unknown state")],
        query=ListQuery,
        answer=JobList,
    )
    async def handle_list(self, request: web.Request) -> web.Response:
        """This node's jobs, newest first"""
        state = request.query.get("state")
        if state is not None and state not in {s.value for s in JobState}:
            states = ", ".join(s.value for s in JobState)
            raise JobError(400, "invalid_query", f"state must be one of {states}")
        records = tuple(self.service.record(e) for e in self.service.entries(state))
        return web.json_response(JobList(jobs=records).to_json())

    def _entry(self, request: web.Request) -> JobEntry:
        return self.service.get(request.match_info["job_id"])

    @route("GET", JOB_PATH, callers=READ, errors=[NO_JOB], answer=JobRecord)
    async def handle_get(self, request: web.Request) -> web.Response:
        """One job's record"""
        return web.json_response(self.service.record(self._entry(request)).to_json())

    @route(
        "GET",
        f"{JOB_PATH}/wait",
        callers=READ,
        errors=[BAD_QUERY, NO_JOB],
        query=WaitQuery,
        answer=JobRecord,
    )
    async def handle_wait(self, request: web.Request) -> web.Response:
        """Long-poll until the job ends or timeout_s passes; answers the record"""
        timeout_s = query_number(request, "timeout_s", DEFAULT_WAIT_S)
        assert timeout_s is not None
        entry = await self.service.wait(request.match_info["job_id"], timeout_s)
        return web.json_response(self.service.record(entry).to_json())

    @route(
        "POST",
        f"{JOB_PATH}/kill",
        callers=WORK,
        errors=[Refusal(400, "invalid_job", "unknown signal"), NO_JOB],
        body=KillBody,
        body_optional=True,
        answer=JobRecord,
    )
    async def handle_kill(self, request: web.Request) -> web.Response:
        """Signal the job's process group ({"signal"?: "TERM", "grace_s"?: 10}), SIGKILL after
        the grace; the job ends killed"""
        body = await json_body(request)
        signal_name, grace_s = parse_kill(body, self.service.settings.kill_grace_s)
        entry = await self.service.kill(request.match_info["job_id"], signal_name, grace_s)
        return web.json_response(self.service.record(entry).to_json())

    @route(
        "DELETE",
        JOB_PATH,
        callers=[Caller.OPERATOR],
        answers=((200, "deleted"),),
        errors=[NO_JOB, Refusal(409, "job_running", "the job still runs")],
        answer=Deleted,
    )
    async def handle_delete(self, request: web.Request) -> web.Response:
        """Remove an ended job's record, logs and working directory"""
        job_id = request.match_info["job_id"]
        await self.service.delete(job_id)
        return web.json_response(Deleted(job_id=job_id).to_json())

    @route(
        "GET",
        f"{JOB_PATH}/logs",
        callers=READ,
        answers=((200, "log bytes"),),
        errors=[Refusal(400, "invalid_query", "bad stream or number"), NO_JOB],
        query=LogsQuery,
        answer=BINARY,
        answer_type="application/octet-stream",
    )
    async def handle_logs(self, request: web.Request) -> web.StreamResponse:
        """Log bytes from offset (or the last tail lines); X-Start-Offset is the first byte's
        offset, X-Next-Offset where to continue (following: add the bytes received)"""
        entry = self._entry(request)
        stream = request.query.get("stream", "stdout")
        if stream not in STREAMS:
            raise JobError(400, "invalid_query", "stream must be stdout or stderr")
        offset = query_number(request, "offset", None)
        tail = query_number(request, "tail", None)
        follow = request.query.get("follow", "0") in ("1", "true", "yes")
        path = entry.log_path(stream)
        size = entry.log_bytes()[stream]
        if offset is not None:
            start = int(offset)
        elif tail is not None:
            start = await asyncio.to_thread(tail_offset, path, int(tail), size)
        else:
            start = 0
        headers = {
            "Content-Type": "application/octet-stream",
            START_OFFSET_HEADER: str(start),
            "X-Job-State": entry.state.value,
        }
        if not follow:
            end = max(size, start)
            headers[NEXT_OFFSET_HEADER] = str(end)
            response = web.StreamResponse(headers=headers)
            response.content_length = end - start
            await response.prepare(request)
            await self._copy(response, path, start, end)
            await response.write_eof()
            return response
        # Following: the body runs until the job ended and its log is read to the end; a
        # reader cut off reconnects at X-Start-Offset plus the bytes it received.
        headers[NEXT_OFFSET_HEADER] = str(start)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        position = start
        while True:
            ended = entry.ended.is_set()
            data = await asyncio.to_thread(read_at, path, position, READ_CHUNK_BYTES)
            if data:
                await response.write(data)
                position += len(data)
                continue
            if ended:
                break
            await asyncio.sleep(FOLLOW_POLL_S)
        await response.write_eof()
        return response

    @staticmethod
    async def _copy(response: web.StreamResponse, path: Any, start: int, end: int) -> None:
        position = start
        while position < end:
            data = await asyncio.to_thread(
                read_at, path, position, min(READ_CHUNK_BYTES, end - position)
            )
            if not data:
                break
            await response.write(data)
            position += len(data)

    @route(
        "GET",
        f"{JOB_PATH}/files",
        callers=[Caller.PEER, Caller.OPERATOR],
        answers=((200, "the bytes"),),
        errors=[
            Refusal(400, "bad_path", "path escapes or is malformed"),
            Refusal(404, "file_not_found", "no such file"),
            NO_JOB,
        ],
        query=FilesQuery,
        answer=BINARY,
        answer_type="application/octet-stream",
    )
    async def handle_files(self, request: web.Request) -> web.StreamResponse:
        """A file of the job's working directory, with X-Shoal-Content-Hash"""
        entry = self._entry(request)
        rel = request.query.get("path", "")
        raw = request.rel_url.raw_query_string
        try:
            check_raw_query_value(raw)
            fd, info = await asyncio.to_thread(open_inside, entry.cwd(), rel)
        except PathRefusedError as exc:
            raise JobError(400, "bad_path", f"path {rel!r}: {exc}") from exc
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise JobError(
                404, "file_not_found", f"no file {rel!r} in the working directory of {entry.job_id}"
            ) from exc
        try:
            _, digest, _ = await asyncio.to_thread(digest_of_fd, fd, DEFAULT_PIECE_SIZE)
            headers = {HASH_HEADER: digest, "Content-Type": "application/octet-stream"}
            response = web.StreamResponse(headers=headers)
            response.content_length = info.st_size
            await response.prepare(request)
            position = 0
            while position < info.st_size:
                data = await asyncio.to_thread(
                    os.pread, fd, min(READ_CHUNK_BYTES, info.st_size - position), position
                )
                if not data:
                    break
                await response.write(data)
                position += len(data)
            await response.write_eof()
            return response
        finally:
            os.close(fd)
