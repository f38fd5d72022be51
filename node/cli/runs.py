"""`shoal runs submit|list|status|logs|cancel`: the cluster's run queue from a shell (any node
forwards to the coordinator)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

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

runs_app = typer.Typer(
    help="Runs: queue a training run per concurrency group; results go to the results store.",
    no_args_is_help=True,
)

RunIdArgument = Annotated[str, typer.Argument(help="Run id (shoal runs list).")]
FOLLOW_POLL_S = 1.0


def _where(node: str | None, config_file: Path | None) -> tuple[NodeSettings, str]:
    settings = settings_from(config_file).settings
    return settings, node_url(settings, node)


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
    body: dict[str, Any] = {"argv": argv, "group": group, "keep_alive": keep_alive}
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
    record = asyncio.run(request_json(settings, "POST", f"{url}/v1/runs", body))
    if as_json:
        print_json(record)
    else:
        console.print(f"queued {record['run_id']} in group {record['group']}")


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
    runs = asyncio.run(request_json(settings, "GET", f"{url}/v1/runs{query}"))["runs"]
    if as_json:
        print_json(runs)
        return
    table = Table("run", "group", "name", "state", "step", "submitted", "ended")
    for run in runs:
        table.add_row(
            run["run_id"],
            run["group"],
            run["name"],
            run["state"],
            run["step"],
            _when(run["submitted_at"]),
            _when(run["ended_at"]),
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
    run = asyncio.run(request_json(settings, "GET", f"{url}/v1/runs/{run_id}"))
    if as_json:
        print_json(run)
        return
    console.print(f"{run['run_id']} ({run['name']}, group {run['group']}): {run['state']}")
    for line in run["log"]:
        note = f": {line['note']}" if line.get("note") else ""
        console.print(f"  {_when(line['at'])} {line['step']}{note}")
    for upload in run["uploaded"]:
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
    run = asyncio.run(request_json(settings, "POST", f"{url}/v1/runs/{run_id}/cancel", {}))
    if as_json:
        print_json(run)
    else:
        console.print(f"{run['run_id']}: {run['state']}")


async def _member_logs(
    settings: NodeSettings, run: dict[str, Any], offsets: dict[str, int]
) -> bool:
    """Print the new log bytes of every member, prefixed by node; True once the job ended."""
    if not run.get("job_url"):
        return False
    gang = await request_json(settings, "GET", f"{run['job_url']}/v1/jobs/{run['run_id']}")
    members = (gang.get("gang") or {}).get("members") or [
        {"node": run["job_node"], "url": run["job_url"], "job_id": run["run_id"]}
    ]
    async with peer_client(settings) as peers:
        for member in members:
            key = str(member["job_id"])
            path = f"/v1/jobs/{key}/logs?offset={offsets.get(key, 0)}"
            try:
                response = await peers.request("GET", member["url"], path, check=False)
            except PeerRequestError as exc:
                sys.stderr.write(f"[{member['node']}] {exc.reason}\n")
                continue
            if response.status != 200:
                continue
            data = response.body
            offsets[key] = int(response.headers.get("X-Next-Offset", offsets.get(key, 0)))
            for line in data.decode(errors="replace").splitlines():
                sys.stdout.write(f"[{member['node']}] {line}\n")
    return str(gang.get("state")) in ("succeeded", "failed", "killed", "timed_out", "lost")


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
            run = await request_json(settings, "GET", f"{url}/v1/runs/{run_id}")
            ended = await _member_logs(settings, run, offsets)
            if not follow or ended or run["step"] == "done":
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    asyncio.run(show())
