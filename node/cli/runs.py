"""`shoal runs submit|list|status|logs|cancel`: the cluster's run queue from a shell (any node
forwards to the coordinator)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from config import NodeSettings
from node.cli.common import (
    ConfigOption,
    JsonOption,
    NodeOption,
    console,
    fail,
    node_url,
    peer_client,
    print_json,
    request_json,
    settings_from,
)
from node.cli.wal import parse_duration_s
from node.errors import PeerRequestError

if TYPE_CHECKING:
    from node.runs.queue import RunRecord

runs_app = typer.Typer(
    help="Runs: queue a training run per concurrency group; results go to the results store.",
    no_args_is_help=True,
)

RunIdArgument = Annotated[str, typer.Argument(help="Run id (shoal runs list).")]
FOLLOW_POLL_S = 1.0


def _where(node: str | None, config_file: Path | None) -> tuple[NodeSettings, str]:
    settings = settings_from(config_file).settings
    return settings, node_url(settings, node)


def _run_of(answer: object, url: str) -> RunRecord:
    """A node's answer read as a run record; exits naming the node when it is not one."""
    from node.runs.queue import RunRecord

    try:
        return RunRecord.model_validate(answer)
    except ValueError as exc:
        fail(f"{url} answered something that is not a run record: {exc}")


def _when(stamp: object) -> str:
    if not isinstance(stamp, int | float):
        return "-"
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


@runs_app.command(
    "submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def submit(
    ctx: typer.Context,
    group: Annotated[str, typer.Option("--group", help="Concurrency group.")] = "training",
    stack: Annotated[str | None, typer.Option("--stack", help="A stack of the inventory.")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", help="Nodes of the gang job.")] = None,
    role: Annotated[str | None, typer.Option("--role", help="Role of those nodes.")] = None,
    keep_alive: Annotated[
        bool, typer.Option("--keep-alive", help="Do not stop the nodes afterwards.")
    ] = False,
    max_duration: Annotated[
        str | None, typer.Option("--max-duration", help="Safety stop, e.g. 90s, 10m, 6h.")
    ] = None,
    results: Annotated[
        list[str] | None,
        typer.Option("--results", help="A path (in the job's directory) to collect; repeatable."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Name of the run.")] = None,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Queue a run: `shoal runs submit [OPTIONS] -- ARGV...`."""
    argv = list(ctx.args)
    if not argv:
        fail("give the command after `--`: shoal runs submit [OPTIONS] -- ARGV...")
    body: dict[str, object] = {"argv": argv, "group": group, "keep_alive": keep_alive}
    for key, value in (("stack", stack), ("nodes", nodes), ("role", role), ("name", name)):
        if value is not None:
            body[key] = value
    if results:
        body["results"] = list(results)
    if max_duration is not None:
        try:
            body["max_duration_s"] = parse_duration_s(max_duration)
        except ValueError as exc:
            fail(f"--max-duration: {exc}")
    settings, url = _where(node, config_file)
    run = _run_of(asyncio.run(request_json(settings, "POST", f"{url}/v1/runs", body)), url)
    if as_json:
        print_json(run.to_json())
    else:
        console.print(f"queued {run.run_id} in group {run.group}")


@runs_app.command("list")
def list_runs(
    group: Annotated[str | None, typer.Option("--group", help="Only this group.")] = None,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """Every run, oldest first."""
    settings, url = _where(node, config_file)
    query = f"?group={group}" if group else ""
    answer = asyncio.run(request_json(settings, "GET", f"{url}/v1/runs{query}"))
    runs = [_run_of(run, url) for run in answer["runs"]]
    if as_json:
        print_json([run.to_json() for run in runs])
        return
    table = Table("run", "group", "name", "state", "step", "submitted", "ended")
    for run in runs:
        table.add_row(
            run.run_id,
            run.group,
            run.name,
            run.state.value,
            run.step.value,
            _when(run.submitted_at),
            _when(run.ended_at),
        )
    console.print(table)


@runs_app.command("status")
def status(
    run_id: RunIdArgument,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """One run: state, step, its steps' log and the results it stored."""
    settings, url = _where(node, config_file)
    run = _run_of(asyncio.run(request_json(settings, "GET", f"{url}/v1/runs/{run_id}")), url)
    if as_json:
        print_json(run.to_json())
        return
    console.print(f"{run.run_id} ({run.name}, group {run.group}): {run.state.value}")
    for line in run.log:
        note = f": {line.note}" if line.note else ""
        console.print(f"  {_when(line.at)} {line.step.value}{note}")
    for upload in run.uploaded:
        console.print(f"  result {upload['key']} {upload.get('hash', 'missing')}")


@runs_app.command("cancel")
def cancel(
    run_id: RunIdArgument,
    node: NodeOption = None,
    as_json: JsonOption = False,
    config_file: ConfigOption = None,
) -> None:
    """A queued run is removed; a running one is killed and its results still collected."""
    settings, url = _where(node, config_file)
    answer = asyncio.run(request_json(settings, "POST", f"{url}/v1/runs/{run_id}/cancel", {}))
    run = _run_of(answer, url)
    if as_json:
        print_json(run.to_json())
    else:
        console.print(f"{run.run_id}: {run.state.value}")


async def _member_logs(settings: NodeSettings, run: RunRecord, offsets: dict[str, int]) -> bool:
    """Print the new log bytes of every member, prefixed by node; True once the job ended."""
    from node.jobs.records import JobRecord

    if not run.job_url:
        return False
    url = f"{run.job_url}/v1/jobs/{run.run_id}"
    try:
        job = JobRecord.model_validate(await request_json(settings, "GET", url))
    except ValueError as exc:
        fail(f"{url} answered something that is not a job record: {exc}")
    members = [(m.node, m.url, m.job_id) for m in (job.gang.members if job.gang else ())] or [
        (str(run.job_node), run.job_url, run.run_id)
    ]
    async with peer_client(settings) as peers:
        for node, member_url, key in members:
            path = f"/v1/jobs/{key}/logs?offset={offsets.get(key, 0)}"
            try:
                response = await peers.request("GET", member_url, path, check=False)
            except PeerRequestError as exc:
                sys.stderr.write(f"[{node}] {exc.reason}\n")
                continue
            if response.status != 200:
                continue
            data = response.body
            offsets[key] = int(response.headers.get("X-Next-Offset", offsets.get(key, 0)))
            for line in data.decode(errors="replace").splitlines():
                sys.stdout.write(f"[{node}] {line}\n")
    return job.state.ended


@runs_app.command("logs")
def logs(
    run_id: RunIdArgument,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Until the run ends.")] = False,
    node: NodeOption = None,
    config_file: ConfigOption = None,
) -> None:
    """The members' job logs (stdout), each line prefixed by its node."""
    settings, url = _where(node, config_file)

    async def show() -> None:
        offsets: dict[str, int] = {}
        while True:
            run = _run_of(await request_json(settings, "GET", f"{url}/v1/runs/{run_id}"), url)
            ended = await _member_logs(settings, run, offsets)
            if not follow or ended or run.step == "done":
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    asyncio.run(show())
