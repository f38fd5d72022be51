"""Drain and leave on three loopback `shoal serve` processes: draining the training node moves
its rank in the next plan, refuses new jobs there while a running one finishes, survives a
SIGKILL of the coordinator, and is undone by undrain; a leave (`shoal node leave`, or SIGTERM)
shows `left` at every peer with no suspicion; the audit trail lists the drains."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from node.cli import app
from tests.node.jobs.client_daemon import ROOT, child_env, free_port
from tests.node.providers.fake_nvml import write_fake_nvml

NAMES = ("v1", "v2", "v3")
pytestmark = pytest.mark.timeout(300)


class Node:
    """One `shoal serve` child process of the test cluster."""

    def __init__(self, name: str, workdir: Path, port: int, env: dict[str, str]) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.config_file = workdir / f"{name}.json"
        self.log_path = workdir / f"{name}.log"
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "node", "serve", "--config", str(self.config_file)],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def signal(self, kill: bool) -> None:
        assert self.process is not None
        if kill:
            self.process.kill()
        else:
            self.process.terminate()

    def wait(self, timeout_s: float = 30.0) -> int:
        assert self.process is not None
        code = self.process.wait(timeout_s)
        self.process = None
        return code

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])


@contextlib.contextmanager
def cluster(workdir: Path) -> Iterator[dict[str, Node]]:
    """Three voters, no GPUs (a fake NVML shows none, whatever this host has), one trainer."""
    gpus = write_fake_nvml(workdir / "fake_nvml")
    env = gpus.child_env(child_env())
    ports = {name: free_port() for name in NAMES}
    nodes = {name: Node(name, workdir, ports[name], env) for name in NAMES}
    for name, node in nodes.items():
        config = {
            "node_id": name,
            "bind": "127.0.0.1",
            "port": node.port,
            "data_dir": str(workdir / name),
            "mdns": False,
            "cluster_name": f"drain-{workdir.name}",
            "voters": list(NAMES),
            "seeds": [f"127.0.0.1:{p}" for n, p in ports.items() if n != name],
            "backend": "gloo",
            "min_training": 1,
            "max_training": 1,
            "timeouts": {
                "probe_interval_s": 0.1,
                "probe_timeout_s": 0.05,
                "indirect_probe_timeout_s": 0.1,
                "suspicion_s": 0.5,
                "heartbeat_interval_s": 0.05,
                "lease_s": 0.4,
                "election_min_s": 0.3,
                "election_max_s": 0.6,
            },
        }
        node.config_file.write_text(json.dumps(config))
    try:
        for node in nodes.values():
            node.start()
        yield nodes
    finally:
        for node in nodes.values():
            if node.process is not None:
                node.signal(kill=True)
                node.wait()


async def until(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            if await predicate():
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def get(url: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        return await response.json()


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=body) as response,
    ):
        return response.status, await response.json()


async def cli(*args: str) -> tuple[int, str]:
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
    return result.exit_code, result.output


async def agreed(nodes: dict[str, Node], alive: list[str]) -> dict[str, Any]:
    """The plan every node of `alive` applies once they agree on one coordinator and fence."""
    found: list[dict[str, Any]] = []

    async def one() -> bool:
        announces = [await get(f"{nodes[n].url}/v1/plan") for n in alive]
        # a node whose election has not started yet answers 503 (an error, no coordinator)
        coordinators = {a.get("coordinator") for a in announces}
        plans = [a.get("plan") for a in announces]
        if len(coordinators) != 1 or None in coordinators or None in plans:
            return False
        if len({(p["term"], p["version"]) for p in plans}) != 1:
            return False
        found.append({"coordinator": coordinators.pop(), **plans[0]})
        return True

    await until(one, 30, f"{', '.join(alive)} to agree on a coordinator and plan")
    return found[-1]


def job_body(release: Path) -> dict[str, Any]:
    """A job that runs until the file `release` exists (the test decides when it ends)."""
    code = (
        "import pathlib, time\n"
        f"p = pathlib.Path({str(release)!r})\n"
        "while not p.exists():\n"
        "    time.sleep(0.05)\n"
    )
    return {"argv": [sys.executable, "-c", code], "name": "drain-test"}


async def test_drain_moves_the_rank_refuses_jobs_survives_failover_and_leave_is_seen_at_once(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path) as nodes:
        all_names = list(NAMES)
        try:
            plan = await agreed(nodes, all_names)
        except AssertionError:
            raise AssertionError("\n".join(n.log_tail() for n in nodes.values())) from None
        assert len(plan["training_ranks"]) == 1
        trainer = plan["training_ranks"][0]
        others = [n for n in NAMES if n != trainer]
        release = tmp_path / "release"
        status, job = await post(f"{nodes[trainer].url}/v1/jobs", job_body(release))
        assert status in (200, 201, 202), job
        job_id = job["job_id"]

        # drain the training node through another node (forwarded to the coordinator)
        code, output = await cli("node", "drain", trainer, "--node", nodes[others[0]].url, "--json")
        assert code == 0, output
        answer = json.loads(output)
        assert answer["draining"] is True
        assert answer["applied"] is True
        plan = await agreed(nodes, all_names)
        assert trainer in plan["draining"]
        assert len(plan["training_ranks"]) == 1
        assert plan["training_ranks"][0] != trainer
        status_doc = await get(f"{nodes[trainer].url}/v1/status")
        assert status_doc["drain"] == {"kill_after_s": None}

        # no new job lands there; the running one goes on and finishes
        status, refused = await post(f"{nodes[trainer].url}/v1/jobs", job_body(release))
        assert status == 409, refused
        assert refused["error"] == "node_draining"
        assert "draining" in refused["reason"]
        record = await get(f"{nodes[trainer].url}/v1/jobs/{job_id}")
        assert record["state"] == "running"
        release.touch()
        code, output = await cli(
            "node", "drain", trainer, "--wait", "--timeout", "60", "--node", nodes[trainer].url
        )
        assert code == 0, output
        assert "runs no jobs" in output
        record = await get(f"{nodes[trainer].url}/v1/jobs/{job_id}")
        assert record["state"] == "succeeded"

        # the drain survives a SIGKILL of the coordinator
        old_coordinator = plan["coordinator"]
        nodes[old_coordinator].signal(kill=True)
        nodes[old_coordinator].wait()
        survivors = [n for n in NAMES if n != old_coordinator]
        after: dict[str, Any] = {}

        async def new_term() -> bool:
            current = await agreed(nodes, survivors)
            after.update(current)
            return bool(
                current["coordinator"] != old_coordinator and current["term"] > plan["term"]
            )

        await until(new_term, 30, "a coordinator of a newer term")
        assert trainer in after["draining"]
        assert trainer not in after["training_ranks"]
        # the new coordinator read the drain from the table on a majority of the voters
        table = await get(f"{nodes[after['coordinator']].url}/v1/locks")
        assert table["coordinator"] == after["coordinator"]
        assert table["drains"][trainer]["kill_after_s"] is None
        assert trainer in (await agreed(nodes, survivors))["draining"]
        nodes[old_coordinator].start()
        await until(lambda: _alive_everywhere(nodes, all_names), 30, "the old coordinator back")
        await agreed(nodes, all_names)

        # undrain: the node takes jobs again
        code, output = await cli("node", "undrain", trainer, "--node", nodes[trainer].url, "--json")
        assert code == 0, output
        assert json.loads(output)["draining"] is False
        plan = await agreed(nodes, all_names)
        assert trainer not in plan["draining"]
        status, job = await post(f"{nodes[trainer].url}/v1/jobs", job_body(tmp_path / "never"))
        assert status in (200, 201, 202), job

        # a drain with --kill-after kills what still runs after that many seconds
        code, output = await cli(
            "node", "drain", trainer, "--kill-after", "0", "--wait", "--timeout", "60",
            "--node", nodes[trainer].url,
        )  # fmt: skip
        assert code == 0, output
        record = await get(f"{nodes[trainer].url}/v1/jobs/{job['job_id']}")
        assert record["state"] == "killed", (
            record.get("reason"),
            record.get("signal"),
            record.get("exit_code"),
        )
        code, output = await cli("node", "undrain", trainer, "--node", nodes[trainer].url)
        assert code == 0, output

        # the audit trail of the nodes asked lists the drains and the undrains
        # (the coordinator also audits the calls forwarded to it, with forwarded_by; after the
        # failover that may be others[0])
        audit = await get(f"{nodes[others[0]].url}/v1/audit?kind=drain")
        asked = [e for e in audit["entries"] if "forwarded_by" not in e["detail"]]
        assert [(e["action"], e["subject"]) for e in asked] == [("drain", trainer)]
        forwarded = [e for e in audit["entries"] if "forwarded_by" in e["detail"]]
        if after["coordinator"] == others[0]:  # the trainer's calls, acted on here
            assert {e["detail"]["forwarded_by"] for e in forwarded} == {trainer}
        audit = await get(f"{nodes[trainer].url}/v1/audit?kind=drain")
        entries = [e for e in audit["entries"] if "forwarded_by" not in e["detail"]]
        actions = [e["action"] for e in entries]
        assert actions == ["drain", "undrain", "drain", "undrain"]
        assert {e["subject"] for e in entries} == {trainer}
        assert entries[2]["detail"]["kill_after_s"] == 0
        code, output = await cli("audit", "--kind", "drain", "--node", nodes[trainer].url, "--json")
        assert code == 0, output
        assert len(json.loads(output)["entries"]) == len(audit["entries"])

        # bad input: exit 2
        code, output = await cli("node", "drain", "no-such-node", "--node", nodes[trainer].url)
        assert code == 2, output
        code, output = await cli("node", "drain", "bad id!", "--node", nodes[trainer].url)
        assert code == 2, output

        # a leave by SIGTERM, then by `shoal node leave`: `left` everywhere, never suspect
        for leaver, how in ((others[1], "sigterm"), (others[0], "cli")):
            watchers = [n for n in NAMES if n != leaver and nodes[n].process is not None]
            seen: dict[str, set[str]] = {n: set() for n in watchers}
            stop = asyncio.Event()
            watch = asyncio.create_task(_watch(nodes, watchers, leaver, seen, stop))
            try:
                asked_at = time.monotonic()
                if how == "sigterm":
                    nodes[leaver].signal(kill=False)
                else:
                    code, output = await cli(
                        "node", "leave", leaver, "--node", nodes[trainer].url, "--json"
                    )
                    assert code == 0, output
                    assert json.loads(output) == {"node": leaver, "leaving": True}

                async def left_everywhere(seen: dict[str, set[str]] = seen) -> bool:
                    return all("left" in states for states in seen.values())

                await until(left_everywhere, 30, f"{leaver} shown left at every peer")
                shown_s = time.monotonic() - asked_at
                print(f"leave by {how}: {leaver} shown left at every peer after {shown_s:.2f} s")
            finally:
                stop.set()
                await watch
            assert nodes[leaver].wait() == 0
            for watcher, states in seen.items():
                assert states <= {"alive", "left"}, f"{watcher} saw {leaver} as {states}"
            audit = await get(f"{nodes[trainer].url}/v1/audit?kind=drain")
            if how == "cli":
                assert ("leave", leaver) in [(e["action"], e["subject"]) for e in audit["entries"]]

        # a node that left comes back with a higher incarnation
        leaver = others[0]
        before = await _member(nodes[trainer].url, leaver)
        nodes[leaver].start()

        async def back() -> bool:
            member = await _member(nodes[trainer].url, leaver)
            return bool(
                member["state"] == "alive" and member["incarnation"] > before["incarnation"]
            )

        await until(back, 30, f"{leaver} alive again")


async def _member(url: str, node: str) -> dict[str, Any]:
    peers = await get(f"{url}/v1/peers")
    return next(m for m in peers["members"] if m["node_id"] == node)


async def _alive_everywhere(nodes: dict[str, Node], names: list[str]) -> bool:
    for name in names:
        peers = await get(f"{nodes[name].url}/v1/peers")
        states = {m["node_id"]: m["state"] for m in peers["members"]}
        if any(states.get(other) != "alive" for other in names):
            return False
    return True


async def _watch(
    nodes: dict[str, Node],
    watchers: list[str],
    leaver: str,
    seen: dict[str, set[str]],
    stop: asyncio.Event,
) -> None:
    """Every state of `leaver` each watcher shows, polled until `stop`."""
    while not stop.is_set():
        for watcher in watchers:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, StopIteration):
                seen[watcher].add((await _member(nodes[watcher].url, leaver))["state"])
        await asyncio.sleep(0.02)
