"""Python client of the job API (seed layer 1 style): frozen specs, an explicit state dict and
plain functions. Every function has an async twin named `<name>_async` for asyncio callers; the
plain ones run their twin in a private event loop and refuse to run inside a running loop.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any, cast

from config import NodeSettings, load_inventory, load_settings, read_secret_file
from node.errors import JobClientError
from node.jobs.documents import JobRecordJson
from node.jobs.specs import DeploySpec, JobSpec, make_job_state, new_job_id, start_body
from node.jobs.transport import (
    ENDED_STATES,
    Endpoint,
    JobClientState,
    apply_record,
    base_url,
    endpoint_of,
    fetch_file,
    fetch_record,
    job_exit_code,
    log_chunks_async,
    post_job,
    request_json,
    run_sync,
    wait_record,
)
from node.providers import StaticProvider, ready_node
from node.ssh import DEFAULT_KNOWN_HOSTS

KILL_GRACE_S = 10.0
"""The grace the contract names as the default of a kill without one."""
KILL_SETTLE_S = 30.0
"""How long after the grace a killed job may take to be reported ended before terminate
gives up with JobWaitTimeoutError."""


def local_settings(config_file: str | None) -> NodeSettings:
    """This host's settings (`config_file`, else $SHOAL_CONFIG, then environment, defaults);
    config.ConfigError naming the file and field when they are wrong."""
    return load_settings(config_file).settings


def local_endpoint(settings: NodeSettings, url: str | None = None) -> Endpoint:
    """The local daemon (or `url`) signed with this host's secret."""
    secret = read_secret_file(settings.secret_file) if settings.secret_file else None
    address = url or base_url(settings.bind, settings.port)
    return Endpoint(address.rstrip("/"), secret, settings.timeouts.http_request_s)


async def ready_remote_async(deploy: DeploySpec, settings: NodeSettings) -> tuple[str, Any]:
    """(URL, provider handle or None) of the node an `ssh` or `provision` DeploySpec names:
    acquired through its provider, shoal deployed to it over SSH (unchanged when it already
    runs), its daemon answering."""
    if settings.secret_file is None and deploy.ssh:
        raise JobClientError(
            f"DeploySpec(ssh={deploy.ssh!r}) deploys shoal with the cluster secret, and no "
            "secret_file is configured; set secret_file (chmod 600) in the config"
        )
    inventory = load_inventory(settings.inventory) if settings.inventory else None
    provider = deploy.provider
    if provider is None and deploy.provision is not None:
        if inventory is None:
            raise JobClientError(
                "DeploySpec(provision=...) without a provider picks a host of the inventory, "
                "and no inventory is configured; set inventory or pass provider="
            )
        provider = StaticProvider(inventory)
    ready = await ready_node(
        ssh=deploy.ssh,
        provision=deploy.provision,
        secret=read_secret_file(settings.secret_file) if settings.secret_file else b"",
        inventory=inventory,
        provider=provider,
        known_hosts=settings.ssh_known_hosts or DEFAULT_KNOWN_HOSTS,
    )
    return ready.url, (provider, ready.handle) if ready.handle is not None else None


async def resolve_node_async(deploy: DeploySpec) -> tuple[str, NodeSettings]:
    """(API URL of the node `deploy` names, the local settings that sign requests)."""
    url, settings, _ = await resolve_target_async(deploy)
    return url, settings


async def resolve_target_async(deploy: DeploySpec) -> tuple[str, NodeSettings, Any]:
    """resolve_node_async plus what a provider acquired for it ((provider, handle) or None)."""
    settings = local_settings(deploy.config_file)
    if deploy.ssh or deploy.provision:
        url, acquired = await ready_remote_async(deploy, settings)
        return url, settings, acquired
    url, settings = await _resolve_member_async(deploy, settings)
    return url, settings, None


async def _resolve_member_async(
    deploy: DeploySpec, settings: NodeSettings
) -> tuple[str, NodeSettings]:
    local = local_endpoint(settings, deploy.node_url)
    if not deploy.node_id:
        return local.url, settings
    document = await request_json(local, "GET", "/v1/peers")
    members = document.get("members", []) if isinstance(document, dict) else []
    for member in members:
        if member.get("node_id") != deploy.node_id:
            continue
        if member.get("is_self"):
            return local.url, settings
        if member.get("state") != "alive":
            raise JobClientError(
                f"node {deploy.node_id!r} is {member.get('state')} in the view of {local.url}; "
                "pick an alive node (shoal peers)"
            )
        return base_url(str(member["address"]), int(member["port"])), settings
    known = ", ".join(sorted(str(m.get("node_id")) for m in members)) or "none"
    raise JobClientError(
        f"node {deploy.node_id!r} is not a member known to {local.url} (members: {known})"
    )


async def attach_job_async(deploy: DeploySpec, job_id: str) -> JobClientState:
    """A state for the existing job `job_id` on the node `deploy` names."""
    url, settings, acquired = await resolve_target_async(deploy)
    state = make_job_state()
    state["job_id"] = job_id
    state["node_url"] = url
    state["secret_file"] = str(settings.secret_file) if settings.secret_file else None
    state["request_timeout_s"] = settings.timeouts.http_request_s
    state["acquired"] = None if deploy.keep_alive else acquired
    return state


async def start_job_async(deploy: DeploySpec, job: JobSpec, state: JobClientState) -> JobRecordJson:
    """Start `job` where `deploy` says (after its bootstrap exits 0); fills `state` and
    returns the job's record. A start whose answer was lost is retried with the same id."""
    job_id = job.job_id or new_job_id()
    state.update(await attach_job_async(deploy, job_id))
    state["log_file"] = job.log_file
    if deploy.bootstrap:
        boot = state.copy()
        boot["job_id"] = boot_id = f"{job_id}-bootstrap"
        name = f"{job.name or os.path.basename(job.command[0])}-bootstrap"
        boot_spec = JobSpec(deploy.bootstrap, env=job.env, name=name)
        await post_job(boot, start_body(boot_spec, deploy, boot_id))
        record = await wait_record(boot, 2.0, None)
        state["bootstrap"] = record
        if record.get("state") != "succeeded":
            raise JobClientError(
                f"bootstrap {list(deploy.bootstrap)} on {state['node_url']} ended "
                f"{record.get('state')} (exit code {record.get('exit_code')}, reason: "
                f"{record.get('reason')}); the job was not started; see: shoal jobs logs "
                f"{boot['job_id']} --node {state['node_url']}"
            )
    return await post_job(state, start_body(job, deploy, job_id))


async def poll_status_async(state: JobClientState) -> str:
    """The job's state now: pending, running, succeeded, failed, killed, timed_out or lost."""
    return str((await fetch_record(state))["state"])


async def wait_for_completion_async(
    state: JobClientState, poll_interval: float = 2.0, timeout_s: float | None = None
) -> int:
    """Wait until the job ends (long-polls of `poll_interval` s) and return its exit code (-N
    for a death by signal N). JobEndedError when it ended killed, timed_out or lost;
    JobWaitTimeoutError when `timeout_s` passes first."""
    return job_exit_code(await wait_record(state, poll_interval, timeout_s))


async def stream_logs_async(
    state: JobClientState, follow: bool = True, stream: str = "stdout", tail: int | None = None
) -> AsyncGenerator[str, None]:
    """The job's log as lines without their newline, following until the job ends; each line
    is also appended to the JobSpec's `log_file` when one was given."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    log_file = state.get("log_file")
    with contextlib.ExitStack() as stack:
        copy = None
        if log_file:
            copy = stack.enter_context(open(log_file, "a", encoding="utf-8"))  # noqa: ASYNC230
        async for chunk in log_chunks_async(state, stream, follow, tail=tail):
            *lines, pending = (pending + decoder.decode(chunk)).split("\n")
            for line in lines:
                if copy is not None:
                    copy.write(line + "\n")
                    copy.flush()
                yield line
        pending += decoder.decode(b"", final=True)
        if pending:
            if copy is not None:
                copy.write(pending + "\n")
            yield pending


async def download_async(state: JobClientState, remote: str, local: str) -> Path:
    """Fetch `remote` (relative to the job's working directory) to `local` (a file, or a
    directory to put it in); the file appears only complete and matching the node's
    X-Shoal-Content-Hash (else DownloadHashError). Returns the path written."""
    target = Path(local)
    if await asyncio.to_thread(target.is_dir):
        target = target / Path(remote).name
    return await fetch_file(state, remote, target)


async def terminate_async(
    state: JobClientState, signal: str = "TERM", grace_s: float | None = None
) -> JobRecordJson:
    """Send `signal` to the job's whole process group (SIGKILL after the grace, default the
    node's) and wait until it has ended; returns the final record. A job that already ended is
    left as it is."""
    try:
        return await _kill_async(state, signal, grace_s)
    finally:
        await release_acquired_async(state)


async def release_acquired_async(state: JobClientState) -> None:
    """Release the node a provider acquired for this job (none when `keep_alive`). Idempotent."""
    acquired = state.pop("acquired", None)
    if acquired is not None:
        provider, handle = acquired
        await provider.release(handle)


async def _kill_async(state: JobClientState, signal: str, grace_s: float | None) -> JobRecordJson:
    known = state["record"]
    if state["status"] in ENDED_STATES and known:
        return known.copy()
    body: dict[str, str | float] = {"signal": signal}
    if grace_s is not None:
        body["grace_s"] = grace_s
    endpoint = endpoint_of(state)
    record = await request_json(endpoint, "POST", f"/v1/jobs/{state['job_id']}/kill", body)
    answered = apply_record(state, record)
    if answered["state"] in ENDED_STATES:
        return answered.copy()
    bound_s = (KILL_GRACE_S if grace_s is None else grace_s) + KILL_SETTLE_S
    return await wait_record(state, min(2.0, bound_s), bound_s)


async def remove_job_async(state: JobClientState) -> None:
    """Remove an ended job's record, logs and working directory from its node."""
    await request_json(endpoint_of(state), "DELETE", f"/v1/jobs/{state['job_id']}")
    state["status"] = "removed"


async def list_jobs_async(deploy: DeploySpec, state: str | None = None) -> list[JobRecordJson]:
    """The jobs of the node `deploy` names, newest first (only those in `state` if given)."""
    url, settings = await resolve_node_async(deploy)
    params = {"state": state} if state else None
    document = await request_json(local_endpoint(settings, url), "GET", "/v1/jobs", params=params)
    jobs = document.get("jobs", []) if isinstance(document, dict) else document
    return [cast(JobRecordJson, dict(job)) for job in jobs]  # each the node's JobRecord JSON


@contextlib.asynccontextmanager
async def run_job_async(deploy: DeploySpec, job: JobSpec) -> AsyncIterator[JobClientState]:
    """Start `job`; on exit kill it if it still runs (unless `deploy.keep_alive`)."""
    state = make_job_state()
    await start_job_async(deploy, job, state)
    try:
        yield state
    finally:
        if not deploy.keep_alive:
            await terminate_async(state)  # also releases a node a provider acquired


def start_job(deploy: DeploySpec, job: JobSpec, state: JobClientState) -> JobRecordJson:
    """Plain twin of `start_job_async`."""
    return run_sync(start_job_async(deploy, job, state))


def attach_job(deploy: DeploySpec, job_id: str) -> JobClientState:
    """Plain twin of `attach_job_async`."""
    return run_sync(attach_job_async(deploy, job_id))


def poll_status(state: JobClientState) -> str:
    """Plain twin of `poll_status_async`."""
    return run_sync(poll_status_async(state))


def wait_for_completion(
    state: JobClientState, poll_interval: float = 2.0, timeout_s: float | None = None
) -> int:
    """Plain twin of `wait_for_completion_async`."""
    return run_sync(wait_for_completion_async(state, poll_interval, timeout_s))


def stream_logs(
    state: JobClientState, follow: bool = True, stream: str = "stdout", tail: int | None = None
) -> Generator[str, None, None]:
    """Plain twin of `stream_logs_async`: an iterator that drives a private event loop."""
    run_sync(asyncio.sleep(0))  # refuses a running loop before the first line is asked for
    with contextlib.closing(asyncio.new_event_loop()) as loop:
        lines = stream_logs_async(state, follow, stream, tail)
        try:
            while True:
                try:
                    yield loop.run_until_complete(anext(lines))
                except StopAsyncIteration:
                    return
        finally:
            loop.run_until_complete(lines.aclose())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())


def download(state: JobClientState, remote: str, local: str) -> Path:
    """Plain twin of `download_async`."""
    return run_sync(download_async(state, remote, local))


def terminate(
    state: JobClientState, signal: str = "TERM", grace_s: float | None = None
) -> JobRecordJson:
    """Plain twin of `terminate_async`."""
    return run_sync(terminate_async(state, signal, grace_s))


def remove_job(state: JobClientState) -> None:
    """Plain twin of `remove_job_async`."""
    run_sync(remove_job_async(state))


def list_jobs(deploy: DeploySpec, state: str | None = None) -> list[JobRecordJson]:
    """Plain twin of `list_jobs_async`."""
    return run_sync(list_jobs_async(deploy, state))


@contextlib.contextmanager
def run_job(deploy: DeploySpec, job: JobSpec) -> Iterator[JobClientState]:
    """Plain twin of `run_job_async`."""
    state = make_job_state()
    start_job(deploy, job, state)
    try:
        yield state
    finally:
        if not deploy.keep_alive:
            terminate(state)  # also releases a node a provider acquired
