"""`shoal jobs run|list|status|logs|wait|kill|download|rm`: the job API of a node from a shell.

`run --wait` and `wait` exit like `ssh host cmd`: with the job's exit code, 128+N for a death by
signal N, 1 (reason on stderr) for killed, timed_out or lost, 124 when `wait --timeout` passes.
"""

from __future__ import annotations

import asyncio
import os
import signal as signals
import sys
from collections.abc import AsyncIterator, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, Any, NoReturn, TypeVar

import typer
from rich.table import Table

from node.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    ConfigOption,
    JsonOption,
    NodeOption,
    config_errors,
    console,
    err_console,
    fail,
    print_json,
)
from node.errors import JobClientError, JobWaitTimeoutError
from node.jobs.client import (
    attach_job_async,
    download_async,
    list_jobs_async,
    remove_job_async,
    start_job_async,
    terminate_async,
)
from node.jobs.documents import JobRecordJson
from node.jobs.specs import DeploySpec, JobSpec, make_job_state
from node.jobs.transport import (
    JobClientState,
    fetch_record,
    log_chunks_async,
    signal_number,
    wait_record,
)

T = TypeVar("T")
EXIT_WAIT_TIMEOUT = 124
WAIT_POLL_S = 5.0

jobs_app = typer.Typer(
    help="Jobs: run a command on a node or a gang of nodes, follow its logs, wait, kill, fetch.",
    no_args_is_help=True,
)

JobIdArgument = Annotated[str, typer.Argument(help="Job id (shoal jobs list).")]


def _deploy(node: str | None, config_file: Path | None) -> DeploySpec:
    return DeploySpec(node_url=node, config_file=str(config_file) if config_file else None)


def _call(coro: Coroutine[Any, Any, T]) -> T:
    """Run one client operation; a refusal or an unreachable node exits 1 with one line."""
    try:
        with config_errors():
            return asyncio.run(coro)
    except JobWaitTimeoutError:
        raise
    except JobClientError as exc:
        fail(str(exc), EXIT_FAILURE)
    raise AssertionError("unreachable")  # pragma: no cover


def exit_status(record: Mapping[str, Any]) -> tuple[int, str | None]:
    """(exit status for the shell, line for stderr or None) of an ended job's record."""
    job_id, state = record.get("job_id"), record.get("state")
    reason = record.get("reason") or "no reason given"
    code = record.get("exit_code")
    number = signal_number(record.get("signal"))
    if state == "succeeded":
        return 0, None
    if state == "failed":
        if isinstance(code, int) and not isinstance(code, bool) and code > 0:
            return code, None
        if number is not None:
            return 128 + number, f"job {job_id} died of signal {_signal_name(number)}"
        return EXIT_FAILURE, f"job {job_id} failed: {reason}"
    return EXIT_FAILURE, f"job {job_id} ended {state}: {reason}"


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return str(number)


def _finish(record: Mapping[str, Any], as_json: bool) -> NoReturn:
    """Print the ended job (JSON when asked) and exit with its status."""
    code, message = exit_status(record)
    if as_json:
        print_json(record)
    if message:
        err_console.print(f"shoal: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _parse_env(pairs: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in pairs or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--env must be KEY=VALUE, got {item!r}")
        env[key] = value
    return env


async def _copy(chunks: AsyncIterator[bytes], out: IO[bytes]) -> None:
    async for chunk in chunks:
        out.write(chunk)
        out.flush()


async def _follow_and_wait(state: JobClientState) -> JobRecordJson:
    """Copy the job's stdout and stderr to ours until it ends; its final record."""
    known = state.get("record")
    if known is None or known.get("gang") is None:
        await asyncio.gather(
            _copy(log_chunks_async(state, "stdout"), sys.stdout.buffer),
            _copy(log_chunks_async(state, "stderr"), sys.stderr.buffer),
        )
        return await wait_record(state, WAIT_POLL_S, None)
    record = await wait_record(state, WAIT_POLL_S, None)  # members' logs stay on their nodes
    for member in gang_members(record):
        err_console.print(member, markup=False, highlight=False, soft_wrap=True)
    return record


def gang_members(record: Mapping[str, Any]) -> list[str]:
    """One line per member of a gang job's record: rank, node, member job id, state, exit."""
    members = (record.get("gang") or {}).get("members") or []
    return [
        f"rank {m.get('rank')} on {m.get('node')}: job {m.get('job_id')} {m.get('state')} "
        f"(exit code {m.get('exit_code')})"
        for m in members
    ]


def _wait_interrupted(state: JobClientState) -> NoReturn:
    if not state.get("job_id"):
        raise typer.Exit(130)
    fail(
        f"stopped waiting; job {state['job_id']} goes on; stop it with: "
        f"shoal jobs kill {state['job_id']} --node {state['node_url']}",
        130,
    )


@jobs_app.command("run", context_settings={"allow_interspersed_args": False})
def jobs_run(
    argv: Annotated[list[str], typer.Argument(help="The command and its arguments, after --.")],
    node: NodeOption = None,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Gang of K nodes.")] = 1,
    role: Annotated[
        str | None, typer.Option("--role", help="training, inference, selfplay or any.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Default: the program.")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="KEY=VALUE added to the environment.")
    ] = None,
    cwd: Annotated[str | None, typer.Option("--cwd", help="Working directory on the node.")] = None,
    env_from: Annotated[
        str | None,
        typer.Option("--env-from", help="rendezvous: add the node's training rendezvous."),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0.001, help="Seconds before timed_out.")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Stream the logs and exit with the job's exit code.")
    ] = False,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Start ARGV (a list, never a shell string) on a node; print its id, or with --wait
    stream its output and exit with its exit code."""
    try:
        spec = JobSpec(
            tuple(argv), _parse_env(env), timeout, None, name, nodes, role, env_from=env_from
        )
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    deploy = DeploySpec(
        node_url=node, workspace=cwd, config_file=str(config_file) if config_file else None
    )
    state = make_job_state()

    async def start() -> JobRecordJson:
        record = await start_job_async(deploy, spec, state)
        if wait and not as_json:
            return await _follow_and_wait(state)
        if wait:
            return await wait_record(state, WAIT_POLL_S, None)
        return record

    try:
        record = _call(start())
    except KeyboardInterrupt:
        _wait_interrupted(state)
    if wait:
        _finish(record, as_json)
    if as_json:
        print_json(record)
    else:
        sys.stdout.write(f"{record['job_id']}\n")


def _when(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")


@jobs_app.command("list")
def jobs_list(
    state: Annotated[str | None, typer.Option("--state", help="Only jobs in this state.")] = None,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """The node's jobs, newest first."""
    jobs = _call(list_jobs_async(_deploy(node, config_file), state))
    if as_json:
        print_json(jobs)
        return
    table = Table(title=f"{len(jobs)} jobs")
    for column in ("job", "name", "state", "exit", "node", "created (UTC)", "command"):
        table.add_column(column)
    for job in jobs:
        code = job.get("exit_code")
        table.add_row(
            str(job.get("job_id")),
            str(job.get("name")),
            str(job.get("state")),
            "-" if code is None else str(code),
            str(job.get("node") or "-"),
            _when(job.get("created_at")),
            " ".join(job.get("argv") or []),
        )
    console.print(table)


@jobs_app.command("status")
def jobs_status(
    job_id: JobIdArgument,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """One job's record: state, exit code, signal, reason, times, log sizes."""

    async def get() -> JobRecordJson:
        return await fetch_record(await attach_job_async(_deploy(node, config_file), job_id))

    record = _call(get())
    if as_json:
        print_json(record)
        return
    table = Table(show_header=False, title=f"job {job_id}")
    for key in ("name", "node", "state", "exit_code", "signal", "reason", "pid"):
        table.add_row(key, "-" if record.get(key) is None else str(record.get(key)))
    table.add_row("command", " ".join(record.get("argv") or []))
    for key in ("created_at", "started_at", "ended_at"):
        table.add_row(key, _when(record.get(key)))
    sizes = record.get("log_bytes") or {}
    table.add_row("log bytes", f"stdout {sizes.get('stdout')}, stderr {sizes.get('stderr')}")
    for line in gang_members(record):
        table.add_row("gang member", line)
    console.print(table)


@jobs_app.command("logs")
def jobs_logs(
    job_id: JobIdArgument,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Follow until it ends.")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="The stderr log.")] = False,
    tail: Annotated[
        int | None, typer.Option("--tail", min=0, help="Only the last N lines first.")
    ] = None,
    node: NodeOption = None,
    config_file: ConfigOption = None,
) -> None:
    """Write a job's stdout (or stderr) log to stdout, byte for byte."""

    async def copy() -> None:
        state = await attach_job_async(_deploy(node, config_file), job_id)
        stream = "stderr" if stderr else "stdout"
        await _copy(log_chunks_async(state, stream, follow, tail=tail), sys.stdout.buffer)

    try:
        _call(copy())
    except BrokenPipeError:
        # the reader went away (e.g. `| head`): stop quietly, and keep the exit flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@jobs_app.command("wait")
def jobs_wait(
    job_id: JobIdArgument,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0, help="Give up after S seconds (124).")
    ] = None,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Wait until a job ends and exit with its exit code (see `shoal jobs --help`)."""
    state = make_job_state()
    state["job_id"], state["node_url"] = job_id, node

    async def wait() -> JobRecordJson:
        state.update(await attach_job_async(_deploy(node, config_file), job_id))
        return await wait_record(state, min(WAIT_POLL_S, timeout or WAIT_POLL_S), timeout)

    try:
        record = _call(wait())
    except JobWaitTimeoutError as exc:
        fail(str(exc), EXIT_WAIT_TIMEOUT)
    except KeyboardInterrupt:
        _wait_interrupted(state)
    _finish(record, as_json)


@jobs_app.command("kill")
def jobs_kill(
    job_id: JobIdArgument,
    grace: Annotated[
        float | None, typer.Option("--grace", min=0, help="Seconds before SIGKILL (default 10).")
    ] = None,
    signal: Annotated[str, typer.Option("--signal", help="First signal: TERM, INT, ...")] = "TERM",
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Signal the job's whole process group, SIGKILL after the grace; it ends `killed`."""

    async def kill() -> JobRecordJson:
        state = await attach_job_async(_deploy(node, config_file), job_id)
        return await terminate_async(state, signal.upper().removeprefix("SIG"), grace)

    record = _call(kill())
    if as_json:
        print_json(record)
        return
    sys.stdout.write(f"job {job_id}: {record.get('state')}\n")


@jobs_app.command("download")
def jobs_download(
    job_id: JobIdArgument,
    path: Annotated[str, typer.Argument(help="File in the job's working directory.")],
    dest: Annotated[
        Path | None, typer.Argument(help="Local file or directory; default ./NAME.")
    ] = None,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Fetch a file from the job's working directory, verified by its content hash."""
    target = dest or Path(Path(path).name or "download")

    async def fetch() -> Path:
        state = await attach_job_async(_deploy(node, config_file), job_id)
        return await download_async(state, path, str(target))

    try:
        written = _call(fetch())
    except OSError as exc:
        fail(f"{target}: cannot write: {exc.strerror or exc}", EXIT_USAGE)
    size = written.stat().st_size
    if as_json:
        print_json({"job_id": job_id, "path": path, "local": str(written), "size_bytes": size})
        return
    sys.stdout.write(f"{written} ({size} bytes)\n")


@jobs_app.command("rm")
def jobs_rm(
    job_id: JobIdArgument,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Remove an ended job: its record, logs and working directory."""

    async def remove() -> None:
        await remove_job_async(await attach_job_async(_deploy(node, config_file), job_id))

    _call(remove())
    if as_json:
        print_json({"job_id": job_id, "removed": True})
        return
    sys.stdout.write(f"removed job {job_id}\n")
