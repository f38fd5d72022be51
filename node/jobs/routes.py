"""The job HTTP API: start, list, get, wait, logs, kill, files and delete under /v1/jobs.

Every error answers `{"error": CODE, "reason": TEXT, "status": N}`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from node.jobs.records import (
    JOB_REQUEST_SCHEMA,
    JobError,
    JobRecord,
    JobState,
    KillBody,
    parse_job_request,
    parse_kill,
)
from node.jobs.service import JobService
from node.jobs.store import STREAMS, JobEntry
from node.openapi import RouteDoc, WireRecord
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


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
StartFn = Callable[[dict[str, Any], Mapping[str, str]], Awaitable[tuple[JobRecord, bool]]]


def job_error_response(error: JobError) -> web.Response:
    return web.json_response(error.to_dict(), status=error.status)


def answers_errors(handler: Handler) -> Handler:
    """Turn JobError and malformed JSON into the one JSON error shape."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except JobError as exc:
            return job_error_response(exc)
        except ValueError as exc:  # malformed JSON, or bytes that are not UTF-8
            return job_error_response(JobError(400, "invalid_json", f"malformed JSON: {exc}"))

    return wrapped


async def json_body(request: web.Request) -> Any:
    """The request's JSON body, or None when it is empty (read even after the auth check)."""
    raw = await request.read()
    return json.loads(raw) if raw.strip() else None


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

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(JOBS_PATH, answers_errors(self.handle_start)),
            web.get(JOBS_PATH, answers_errors(self.handle_list)),
            web.get(JOB_PATH, answers_errors(self.handle_get)),
            web.delete(JOB_PATH, answers_errors(self.handle_delete)),
            web.get(f"{JOB_PATH}/wait", answers_errors(self.handle_wait)),
            web.get(f"{JOB_PATH}/logs", answers_errors(self.handle_logs)),
            web.post(f"{JOB_PATH}/kill", answers_errors(self.handle_kill)),
            web.get(f"{JOB_PATH}/files", answers_errors(self.handle_files)),
        ]

    async def start_single(
        self, body: dict[str, Any], headers: Mapping[str, str]
    ) -> tuple[JobRecord, bool]:
        request = parse_job_request(body)
        if request.nodes != 1 or request.gang is not None:
            raise JobError(
                400, "gang_unavailable", "this node runs single-node jobs only (nodes: 1)"
            )
        entry, created = await self.service.start(request)
        return self.service.record(entry), created

    async def handle_start(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise JobError(400, "invalid_job", "expected a JSON object with argv (a list)")
        record, created = await self.start(body, request.headers)
        return web.json_response(record.to_json(), status=201 if created else 200)

    async def handle_list(self, request: web.Request) -> web.Response:
        state = request.query.get("state")
        if state is not None and state not in {s.value for s in JobState}:
            states = ", ".join(s.value for s in JobState)
            raise JobError(400, "invalid_query", f"state must be one of {states}")
        records = tuple(self.service.record(e) for e in self.service.entries(state))
        return web.json_response(JobList(jobs=records).to_json())

    def _entry(self, request: web.Request) -> JobEntry:
        return self.service.get(request.match_info["job_id"])

    async def handle_get(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.record(self._entry(request)).to_json())

    async def handle_wait(self, request: web.Request) -> web.Response:
        timeout_s = query_number(request, "timeout_s", DEFAULT_WAIT_S)
        assert timeout_s is not None
        entry = await self.service.wait(request.match_info["job_id"], timeout_s)
        return web.json_response(self.service.record(entry).to_json())

    async def handle_kill(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        signal_name, grace_s = parse_kill(body, self.service.settings.kill_grace_s)
        entry = await self.service.kill(request.match_info["job_id"], signal_name, grace_s)
        return web.json_response(self.service.record(entry).to_json())

    async def handle_delete(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        await self.service.delete(job_id)
        return web.json_response({"job_id": job_id, "deleted": True})

    async def handle_logs(self, request: web.Request) -> web.StreamResponse:
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

    async def handle_files(self, request: web.Request) -> web.StreamResponse:
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


JOB_PARAMETER = (("job_id", "path", "The job's id", {"type": "string"}),)
NUMBER_SCHEMA = {"type": "number", "minimum": 0}


def job_route_docs() -> list[RouteDoc]:
    """OpenAPI entries of every job route."""
    return [*_collection_docs(), *_record_docs(), *_output_docs()]


def _collection_docs() -> list[RouteDoc]:
    """POST and GET /v1/jobs: start a job, list the jobs."""
    states = {"enum": [state.value for state in JobState]}
    return [
        RouteDoc(
            "POST",
            JOBS_PATH,
            'Start a job: {"job_id"?, "name", "argv": [...], "env"?, "cwd"?, "timeout_s"?, '
            '"nodes"?, "role"?, "env_from"?: "rendezvous"}; argv is a list, never a string',
            (
                (201, "the job, started"),
                (200, "the existing job with this job_id and the same spec"),
                (
                    400,
                    "invalid request (argv a string, unknown field, ...), or env_from rendezvous "
                    "with a LOCAL_RANK this node does not run (bad_local_rank)",
                ),
                (403, "program not in jobs.allowed_programs"),
                (
                    409,
                    "job_id exists with a different spec, a stale plan fence, no rendezvous, or "
                    "a gang's member 0 whose MASTER_PORT is in use here (master_port_busy)",
                ),
            ),
            body=JOB_REQUEST_SCHEMA,
            response=JobRecord,
        ),
        RouteDoc(
            "GET",
            JOBS_PATH,
            "This node's jobs, newest first",
            ((200, '{"jobs": [record, ...]}'), (400, "unknown state")),
            response=JobList,
            parameters=(
                (
                    "state",
                    "query",
                    "only jobs in this state",
                    states,
                ),
            ),
        ),
    ]


def _record_docs() -> list[RouteDoc]:
    """One job's record: read, delete, wait for its end."""
    job, number = JOB_PARAMETER, NUMBER_SCHEMA
    return [
        RouteDoc(
            "GET",
            JOB_PATH,
            "One job's record",
            ((200, "the record"), (404, "no such job")),
            parameters=job,
            response=JobRecord,
        ),
        RouteDoc(
            "DELETE",
            JOB_PATH,
            "Remove an ended job's record, logs and working directory",
            ((200, "deleted"), (404, "no such job"), (409, "the job still runs")),
            parameters=job,
        ),
        RouteDoc(
            "GET",
            f"{JOB_PATH}/wait",
            "Long-poll until the job ends or timeout_s passes; answers the record",
            ((200, "the record"), (404, "no such job")),
            parameters=(
                *job,
                ("timeout_s", "query", "seconds to wait (default 30, max 600)", number),
            ),
            response=JobRecord,
        ),
    ]


def _output_docs() -> list[RouteDoc]:
    """One job's logs, kill and files."""
    job, number = JOB_PARAMETER, NUMBER_SCHEMA
    return [
        RouteDoc(
            "GET",
            f"{JOB_PATH}/logs",
            "Log bytes from offset (or the last tail lines); X-Start-Offset is the first byte's "
            "offset, X-Next-Offset where to continue (following: add the bytes received)",
            ((200, "log bytes"), (400, "bad stream or number"), (404, "no such job")),
            parameters=(
                *job,
                ("stream", "query", "stdout (default) or stderr", {"enum": list(STREAMS)}),
                ("offset", "query", "first byte to send", number),
                ("tail", "query", "send the last N lines (without offset)", number),
                ("follow", "query", "1: keep streaming until the job ends", {"enum": ["0", "1"]}),
            ),
        ),
        RouteDoc(
            "POST",
            f"{JOB_PATH}/kill",
            'Signal the job\'s process group ({"signal"?: "TERM", "grace_s"?: 10}), SIGKILL '
            "after the grace; the job ends killed",
            ((200, "the record"), (400, "unknown signal"), (404, "no such job")),
            parameters=job,
            body=KillBody,
            body_optional=True,
            response=JobRecord,
        ),
        RouteDoc(
            "GET",
            f"{JOB_PATH}/files",
            "A file of the job's working directory, with X-Shoal-Content-Hash",
            ((200, "the bytes"), (400, "path escapes or is malformed"), (404, "no such file")),
            parameters=(
                *job,
                ("path", "query", "relative path in the working directory", {"type": "string"}),
            ),
        ),
    ]
