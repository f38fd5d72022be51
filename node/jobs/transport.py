"""The HTTP side of the job client: signed requests to a node's job routes, the one error
table, followed logs resumed by offset, and verified file downloads. `node.jobs.client` builds the
public functions on these.

JobClientError
 +-- JobRequestError      the node answered an error (status and the server's reason)
 +-- JobUnreachableError  the node could not be reached or the connection broke
 +-- JobEndedError        the job ended killed, timed_out or lost: no exit code to report
 +-- JobWaitTimeoutError  (also a TimeoutError) the caller's wait ran out
 +-- DownloadHashError    a download did not match X-Shoal-Content-Hash
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal as signals
import socket
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict, TypeVar, cast

from config import Timeouts, read_error, read_secret_file
from config.tls.client import client_scheme, operator_context
from net import Identity, PeerClient, PeerRequestError, local_url
from node.errors import (
    DownloadHashError,
    JobClientError,
    JobEndedError,
    JobRequestError,
    JobUnreachableError,
    JobWaitTimeoutError,
)
from node.jobs.documents import JobRecordJson
from node.jobs.records import JobRecord, JobState

T = TypeVar("T")
ENDED_STATES = frozenset(state.value for state in JobState if state.ended)
NO_EXIT_CODE_STATES = frozenset(
    {JobState.KILLED.value, JobState.TIMED_OUT.value, JobState.LOST.value}
)
HASH_HEADER = "X-Shoal-Content-Hash"
OFFSET_HEADER = "X-Next-Offset"
MANIFEST_PIECE_BYTES = 16 << 20
"""The piece size of sync's manifest hash (sync.DEFAULT_PIECE_SIZE): a file larger than one
piece may be announced by the hash of its piece digests instead of its plain sha256."""
RESUME_WINDOW_S = 30.0
"""How long a followed log keeps reconnecting without a new byte (a daemon restart takes a few
seconds) before it gives up."""
BROKEN = (PeerRequestError, TimeoutError, OSError)


def signal_number(value: object) -> int | None:
    """A record's `signal` (15, "15", "TERM" or "SIGTERM") as a number; None when absent."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip().upper()
    if text.isdigit():
        return int(text)
    try:
        return int(signals.Signals[text if text.startswith("SIG") else f"SIG{text}"])
    except KeyError:
        return None


def job_exit_code(record: JobRecordJson) -> int:
    """The exit code of an ended job, as `subprocess.Popen.returncode` says it (a death by
    signal N is -N); JobEndedError for killed, timed_out and lost, which have none to report."""
    state = record.get("state")
    if state in NO_EXIT_CODE_STATES:
        raise JobEndedError(record)
    if state not in ENDED_STATES:
        raise JobClientError(f"job {record.get('job_id')} has not ended (state {state})")
    code = record.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        if state == "succeeded" and code != 0:
            raise JobClientError(f"job {record.get('job_id')}: succeeded with exit code {code}")
        return code
    number = signal_number(record.get("signal"))
    if state == "failed" and number is not None:
        return -number
    raise JobClientError(f"job {record.get('job_id')} ended {state} without an exit code")


class JobClientState(TypedDict):
    """The explicit state of one job in the Python client (`make_job_state`): where the job
    lives, how to sign requests to it, and what its node answered last (`record`, the
    JobRecord's JSON; `status`, `exit_code`, `signal`, `reason` and `node` copied from it)."""

    job_id: str | None
    node_url: str | None
    secret_file: str | None
    request_timeout_s: float
    log_file: str | None
    status: str
    exit_code: int | None
    signal: str | None
    reason: str | None
    node: str | None
    record: JobRecordJson | None
    acquired: NotRequired[tuple[Any, Any] | None]
    """(provider, handle) of a node a provider acquired for the job; released on terminate."""
    bootstrap: NotRequired[JobRecordJson]
    """The bootstrap job's final record."""


@dataclass(frozen=True)
class Endpoint:
    """A node's API address and how to sign requests to it."""

    url: str
    secret: bytes | None
    request_timeout_s: float


def base_url(host: str, port: int) -> str:
    """The API URL of `host:port` (a wildcard bind is reached on loopback)."""
    return local_url(host, port)


def endpoint_of(state: JobClientState) -> Endpoint:
    """Where the job of `state` lives and how to sign requests to it."""
    if not state.get("node_url") or not state.get("job_id"):
        raise JobClientError("the job state has no job yet: call start_job or attach_job first")
    secret_file = state.get("secret_file")
    secret = read_secret_file(Path(secret_file)) if secret_file else None
    url = client_scheme(str(state["node_url"]), operator_context())
    return Endpoint(url, secret, state["request_timeout_s"])


def open_client(endpoint: Endpoint) -> PeerClient:
    """The peer client of a job client: signed as `cli-HOSTNAME` when a cluster secret is
    configured, presenting the certificate of SHOAL_TLS_CERT / _KEY / _CA when set, each
    request within the endpoint's request timeout."""
    identity = Identity(endpoint.secret, f"cli-{socket.gethostname()}")
    timeouts = Timeouts(http_request_s=endpoint.request_timeout_s)
    context = operator_context()
    return PeerClient(identity, timeouts=timeouts, ssl_context=lambda: context)


def error_of(url: str, status: int, body: bytes) -> JobRequestError:
    """The JobRequestError for an error answer, with the server's `reason`."""
    return JobRequestError(url, status, read_error(status, body).reason or "no reason given")


def job_error(exc: PeerRequestError) -> JobClientError:
    """A failed request of the job client: JobRequestError for the node's error answer,
    JobUnreachableError when there was no answer (or it was not JSON)."""
    if exc.status is not None:
        return JobRequestError(exc.url, exc.status, exc.reason)
    reason = exc.reason if exc.reason.startswith("unreachable") else f"unreachable: {exc.reason}"
    return JobUnreachableError(f"{exc.url}: {reason}")


async def request_json(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: Mapping[str, object] | None = None,
    params: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> Any:
    """One signed request and its JSON answer; JobRequestError for an error answer,
    JobUnreachableError when the node cannot be reached."""
    try:
        async with open_client(endpoint) as peers:
            return await peers.request_json(
                method, endpoint.url, path, body, params=params, timeout_s=timeout_s
            )
    except PeerRequestError as exc:
        raise job_error(exc) from exc


def apply_record(state: JobClientState, record: object) -> JobRecordJson:
    """Copy a job record the node answered into `state` (read as a JobRecord: JobClientError
    naming the field when it is not one); returns the record's JSON."""
    try:
        copied = cast(JobRecordJson, JobRecord.model_validate(record).to_json())
    except ValueError as exc:
        raise JobClientError(
            f"{state.get('node_url')} answered something that is not a job record: {exc}"
        ) from exc
    state["record"] = copied
    state["job_id"] = copied.get("job_id", state["job_id"])
    state["status"] = copied.get("state", state["status"])
    state["exit_code"], state["signal"] = copied["exit_code"], copied["signal"]
    state["reason"], state["node"] = copied["reason"], copied["node"]
    return copied


async def fetch_record(state: JobClientState) -> JobRecordJson:
    """GET the job's record into `state`."""
    record = await request_json(endpoint_of(state), "GET", f"/v1/jobs/{state['job_id']}")
    return apply_record(state, record)


async def post_job(state: JobClientState, body: Mapping[str, object]) -> JobRecordJson:
    """POST /v1/jobs, retried with the same job id (harmless) when the answer was lost."""
    endpoint = endpoint_of(state)
    for attempt in range(3):
        try:
            return apply_record(state, await request_json(endpoint, "POST", "/v1/jobs", body))
        except JobUnreachableError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


async def wait_record(
    state: JobClientState, poll_interval: float, timeout_s: float | None
) -> JobRecordJson:
    """Long-poll the wait route until the job ends; its final record (also put in `state`)."""
    endpoint = endpoint_of(state)
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while True:
        step = poll_interval
        if deadline is not None:
            step = max(0.0, min(poll_interval, deadline - loop.time()))
        record = await request_json(
            endpoint,
            "GET",
            f"/v1/jobs/{state['job_id']}/wait",
            params={"timeout_s": f"{step:.3f}"},
            timeout_s=step + endpoint.request_timeout_s,
        )
        copied = apply_record(state, record)
        if copied.get("state") in ENDED_STATES:
            return copied
        if deadline is not None and loop.time() >= deadline:
            raise JobWaitTimeoutError(
                f"job {state['job_id']} is still {copied.get('state')} after {timeout_s} s"
            )


class _Resume:
    """The failures in a row of one log stream: a stream that broke after progress is resumed
    at once, later ones after a backoff; no byte for RESUME_WINDOW_S raises
    JobUnreachableError."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._loop = asyncio.get_running_loop()
        self.failures = 0
        """Set to 0 on every byte received."""
        self._stalled_since = 0.0

    async def broke(self, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:  # a stream that broke after progress is resumed at once
            self._stalled_since = self._loop.time()
            return
        if self._loop.time() - self._stalled_since > RESUME_WINDOW_S:
            raise JobUnreachableError(
                f"{self._path}: no byte for {RESUME_WINDOW_S:.0f} s over {self.failures} "
                f"attempts: {exc}"
            ) from exc
        await asyncio.sleep(min(1.0, 0.05 * 2 ** (self.failures - 1)))


async def _read_tail(
    peers: PeerClient, url: str, logs: str, stream: str, tail: int
) -> tuple[bytes, int]:
    """The last `tail` lines of a job's log and the offset of their first byte."""
    path = f"{url}{logs}"
    async with peers.stream(
        "GET", url, logs, params={"stream": stream, "tail": str(tail)},
        check=False, unbounded_reads=True,
    ) as got:  # fmt: skip
        data = await got.read()
        if got.status >= 400:
            raise error_of(path, got.status, data)
        if OFFSET_HEADER not in got.headers:
            raise JobClientError(f"{path}: the answer has no {OFFSET_HEADER} header")
        return data, int(got.headers[OFFSET_HEADER])


async def log_chunks_async(
    state: JobClientState,
    stream: str = "stdout",
    follow: bool = True,
    offset: int = 0,
    tail: int | None = None,
) -> AsyncIterator[bytes]:
    """The bytes of a job's log from `offset` (or its last `tail` lines first), following until
    the job ends. A dropped connection is resumed at the next offset, so no byte is lost or
    repeated."""
    endpoint = endpoint_of(state)
    logs = f"/v1/jobs/{state['job_id']}/logs"
    path = f"{endpoint.url}{logs}"
    resume = _Resume(path)
    async with open_client(endpoint) as peers:
        while tail is not None:
            try:
                data, offset = await _read_tail(peers, endpoint.url, logs, stream, tail)
            except BROKEN as exc:
                await resume.broke(exc)
                continue
            tail = None
            if data:
                yield data
        ended = not follow
        while True:
            params = {"stream": stream, "offset": str(offset)}
            if not ended:
                params["follow"] = "1"
            received = 0
            try:
                async with peers.stream(
                    "GET", endpoint.url, logs, params=params, check=False, unbounded_reads=True
                ) as response:
                    if response.status >= 400:
                        raise error_of(path, response.status, await response.read())
                    async for chunk in response.iter_chunks():
                        offset += len(chunk)
                        received += len(chunk)
                        resume.failures = 0
                        yield chunk
                if ended:
                    return
                # the follow stream ended cleanly; once the job has ended, read the rest once
                record = await fetch_record(state)
            except (*BROKEN, JobUnreachableError) as exc:
                await resume.broke(exc)
                continue
            ended = record.get("state") in ENDED_STATES
            if not ended and received == 0:
                await asyncio.sleep(0.1)


class ContentHasher:
    """The plain sha256 of a byte stream and its sync manifest hash (pieces of 16 MiB)."""

    def __init__(self, piece_bytes: int = MANIFEST_PIECE_BYTES) -> None:
        self._whole = hashlib.sha256()
        self._piece = hashlib.sha256()
        self._in_piece = 0
        self._piece_bytes = piece_bytes
        self._digests: list[bytes] = []

    def update(self, data: bytes) -> None:
        self._whole.update(data)
        view = memoryview(data)
        while view:
            take = min(len(view), self._piece_bytes - self._in_piece)
            self._piece.update(view[:take])
            self._in_piece += take
            view = view[take:]
            if self._in_piece == self._piece_bytes:
                self._digests.append(self._piece.digest())
                self._piece, self._in_piece = hashlib.sha256(), 0

    def matches(self, announced: str) -> bool:
        """True when `announced` (hex, optionally `sha256:`-prefixed) is either hash."""
        digests = list(self._digests)
        if self._in_piece or not digests:
            digests.append(self._piece.copy().digest())
        joined = b"".join(digests)
        manifest = digests[0].hex() if len(digests) == 1 else hashlib.sha256(joined).hexdigest()
        wanted = announced.strip().lower().removeprefix("sha256:")
        return wanted in (self._whole.hexdigest(), manifest)


async def fetch_file(state: JobClientState, remote: str, target: Path) -> Path:
    """GET `remote` of the job's working directory into `target` through a temp name; the file
    appears only complete, fsynced and matching X-Shoal-Content-Hash."""
    endpoint = endpoint_of(state)
    part = target.with_name(f".{target.name}.part")
    files = f"/v1/jobs/{state['job_id']}/files"
    url = f"{endpoint.url}{files}"
    hasher = ContentHasher()
    try:
        async with (
            open_client(endpoint) as peers,
            peers.stream(
                "GET", endpoint.url, files, params={"path": remote}, check=False,
                unbounded_reads=True,
            ) as response,
        ):  # fmt: skip
            if response.status >= 400:
                raise error_of(url, response.status, await response.read())
            announced = response.headers.get(HASH_HEADER)
            if not announced:
                raise JobClientError(f"{url}: the answer has no {HASH_HEADER}; refusing it")
            handle = await asyncio.to_thread(part.open, "wb")
            with handle:
                async for chunk in response.iter_chunks(1 << 20):
                    hasher.update(chunk)
                    await asyncio.to_thread(handle.write, chunk)
                await asyncio.to_thread(os.fsync, handle.fileno())
        if not hasher.matches(announced):
            raise DownloadHashError(
                f"{url}?path={remote}: the bytes received do not match {HASH_HEADER} "
                f"{announced}; nothing was written to {target}; download again"
            )
        await asyncio.to_thread(_publish, part, target)
    except (PeerRequestError, TimeoutError) as exc:
        why = exc.reason if isinstance(exc, PeerRequestError) else exc
        raise JobUnreachableError(f"{url}: download of {remote} broke: {why}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(part.unlink)
    return target


def _publish(part: Path, target: Path) -> None:
    os.replace(part, target)
    fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run an async twin to completion from synchronous code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise JobClientError(
        "the job client's plain functions cannot run inside an event loop: "
        "call the async twin (e.g. start_job_async) instead"
    )
