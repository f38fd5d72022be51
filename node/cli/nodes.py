"""`shoal node drain|undrain|leave NODE`: take a node out of the cluster gently (any node
forwards a drain to the coordinator, a leave to the node that leaves).

Exit codes: 0 done; 1 a node is unreachable, refused, or --wait ran out of time; 2 bad input
(an invalid or unknown node id, a negative --kill-after)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from config import NodeSettings
from config.fields import is_valid_node_id
from net import peer_url
from node.cli.common import (
    EXIT_FAILURE,
    ConfigOption,
    JsonOption,
    NodeOption,
    console,
    daemon_of,
    fail,
    print_json,
    request_json,
)
from node.errors import PeerRequestError

node_app = typer.Typer(
    help="Nodes: drain one (no new work goes there), undrain it, or make it leave the cluster.",
    no_args_is_help=True,
)

NodeArgument = Annotated[str, typer.Argument(help="The node's id (shoal peers).")]
WAIT_POLL_S = 0.5


def _checked_node(node: str) -> str:
    if not is_valid_node_id(node):
        fail(f"{node!r} is not a node id (see: shoal peers)")
    return node


def _bad_input(exc: PeerRequestError) -> bool:
    """A 400 or 404 answer: a bad request or an unknown node."""
    return exc.status in (400, 404)


async def _request(
    settings: NodeSettings, method: str, url: str, body: dict[str, float | None] | None = None
) -> Any:
    """One signed request; a 400 or 404 answer exits 2 (bad input), any other error 1."""
    return await request_json(settings, method, url, body, usage_error=_bad_input)


def _change(
    node_id: str,
    action: str,
    node: str | None,
    config_file: Path | None,
    as_json: bool,
    show: Callable[[dict[str, Any]], None],
) -> None:
    """POST `action` (undrain, leave) for `node_id` to the daemon; print its answer as JSON,
    or `show` it."""
    _checked_node(node_id)
    settings, url = daemon_of(node, config_file)
    answer = asyncio.run(_request(settings, "POST", f"{url}/v1/nodes/{node_id}/{action}", {}))
    if as_json:
        print_json(answer)
    else:
        show(answer)


def _say(line: str, as_json: bool) -> None:
    """Progress: on stdout, or on stderr when stdout carries JSON."""
    if as_json:
        print(line, file=sys.stderr, flush=True)
    else:
        console.print(line, markup=False, highlight=False)


async def _node_address(settings: NodeSettings, url: str, node: str) -> str:
    peers = await _request(settings, "GET", f"{url}/v1/peers")
    for member in peers.get("members", []):
        if member.get("node_id") == node:
            if member.get("is_self"):
                return url
            return peer_url(member["address"], member["port"])
    fail(f"node {node} is not in the membership view of {url}", EXIT_FAILURE)


async def _wait_idle(
    settings: NodeSettings, url: str, node: str, timeout_s: float | None, as_json: bool
) -> int:
    """Poll `node`'s status until it applies its drain and runs no jobs; the jobs left (0)."""
    target = await _node_address(settings, url, node)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last: tuple[bool, int] | None = None
    while True:
        status = await _request(settings, "GET", f"{target}/v1/status")
        jobs = status.get("jobs") or {}
        busy = int(jobs.get("running", 0)) + int(jobs.get("pending", 0))
        applied = status.get("drain") is not None
        if (applied, busy) != last:
            last = (applied, busy)
            where = "drains" if applied else "has not applied its drain yet"
            _say(f"node {node} {where}; {busy} jobs running or pending", as_json)
        if applied and busy == 0:
            return 0
        if deadline is not None and time.monotonic() >= deadline:
            fail(
                f"node {node} still runs {busy} jobs after {timeout_s:g} s; wait longer, or "
                f"kill them: shoal node drain {node} --kill-after 0",
                EXIT_FAILURE,
            )
        await asyncio.sleep(WAIT_POLL_S)


@node_app.command("drain")
def drain(
    node_id: NodeArgument,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until the node runs no jobs, printing progress.")
    ] = False,
    kill_after: Annotated[
        float | None,
        typer.Option("--kill-after", help="Kill the node's running jobs after S seconds."),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="With --wait: give up after S seconds.")
    ] = None,
    node: NodeOption = None,
    config_file: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Drain a node: no new work goes there; its running jobs finish (or are killed).

    No new job, gang member, training rank, weights place or actor goes there; its training
    rank moves in the next plan; with --kill-after S its jobs still running after S seconds
    are killed.

    Exit codes: 0 drained (and, with --wait, idle); 1 unreachable, refused or timed out;
    2 bad input."""
    _checked_node(node_id)
    if kill_after is not None and not 0 <= kill_after < float("inf"):
        fail(f"--kill-after {kill_after!r}: seconds >= 0")
    if timeout is not None and not timeout > 0:
        fail(f"--timeout {timeout!r}: seconds > 0")
    settings, url = daemon_of(node, config_file)
    answer = asyncio.run(
        _request(settings, "POST", f"{url}/v1/nodes/{node_id}/drain", {"kill_after_s": kill_after})
    )
    if not as_json:
        _print_change(answer)
    if wait:
        answer["jobs_running"] = asyncio.run(_wait_idle(settings, url, node_id, timeout, as_json))
        _say(f"node {node_id} is drained and runs no jobs", as_json)
    if as_json:
        print_json(answer)


@node_app.command("undrain")
def undrain(
    node_id: NodeArgument,
    node: NodeOption = None,
    config_file: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Undrain a node: it takes new work again from the next plan. It also lifts the node's GPU
    quarantine, held or not, with its count (docs/fault-tolerance.md#gpu-faults).

    Exit codes: 0 undrained; 1 unreachable or refused; 2 bad input."""
    _change(node_id, "undrain", node, config_file, as_json, _print_change)


@node_app.command("leave")
def leave(
    node_id: NodeArgument,
    node: NodeOption = None,
    config_file: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a node leave the cluster: it gossips `left`, then its daemon stops.

    Every peer shows it left at once, with no suspicion; it rejoins when started again.

    Exit codes: 0 it leaves; 1 unreachable or refused; 2 bad input."""

    def show(answer: dict[str, Any]) -> None:
        console.print(f"node {node_id} leaves the cluster", markup=False, highlight=False)

    _change(node_id, "leave", node, config_file, as_json, show)


def _print_change(answer: dict[str, Any]) -> None:
    plan = answer.get("plan")
    fence = "no plan yet" if plan is None else f"plan {plan[0]}.{plan[1]}"
    state = "drains" if answer.get("draining") else "is not draining"
    after = answer.get("kill_after_s")
    kill = f"; its jobs are killed after {after:g} s" if after is not None else ""
    applied = "" if answer.get("applied") else " (it has not acknowledged the plan yet)"
    console.print(
        f"node {answer['node']} {state} ({fence}, coordinator {answer['coordinator']})"
        f"{kill}{applied}",
        markup=False,
        highlight=False,
    )
