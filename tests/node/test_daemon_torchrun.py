"""The training launcher in real daemons on 127.0.0.1: two training nodes with
`training_nproc: 2` run a plain torchrun-style script as 4 gloo workers with torchrun's
environment; SIGKILL of one worker restarts the whole group in a new generation (reason
`worker_exit`) and it all-reduces again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from config import NodeSettings
from health import ENV_FAKE_GPUS
from node import NodeDaemon
from tests.node.daemons import FAST_ELECTION, test_settings

WORKER = str(Path(__file__).with_name("launcher_torchrun_worker.py"))
NAMES = ("t1", "t2")


def worker_events(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


async def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, out: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            tail = "\n".join(out.read_text().splitlines()[-20:]) if out.exists() else "nothing"
            raise AssertionError(f"{what} did not happen within {timeout_s} s; events:\n{tail}")
        await asyncio.sleep(0.1)


def settings_for(tmp_path: Path, name: str, out: Path, seeds: tuple[str, ...]) -> NodeSettings:
    return test_settings(
        tmp_path,
        name,
        **FAST_ELECTION,
        voters=NAMES,
        seeds=seeds,
        role="training",
        backend="gloo",
        gpus="none",
        training_nproc=2,
        training_command=(sys.executable, WORKER),
        training_env={
            "WORKER_OUT": str(out),
            "WORKER_TIMEOUT_S": "30",
            "TORCH_CPP_LOG_LEVEL": "ERROR",
        },
    )


@pytest.mark.timeout(300)
async def test_two_nodes_of_two_workers_form_one_group_and_a_killed_worker_restarts_the_group(
    tmp_path: Path,
) -> None:
    out = tmp_path / "workers.jsonl"
    daemons: dict[str, NodeDaemon] = {}
    try:
        for name in NAMES:
            seeds = (f"127.0.0.1:{daemons['t1'].port}",) if daemons else ()
            daemon = NodeDaemon(settings_for(tmp_path, name, out, seeds))
            await daemon.start()
            daemons[name] = daemon
        urls = {f"http://127.0.0.1:{daemon.port}": name for name, daemon in daemons.items()}

        def started() -> dict[int, dict[str, Any]]:
            """The newest start of each pid, by pid."""
            return {e["pid"]: e for e in worker_events(out) if e["event"] == "start"}

        def reduced_in_world_4(restarted: set[int] | None = None) -> list[dict[str, Any]]:
            """The 'reduced' events of the newest 4-rank group (of pids not in `restarted`)."""
            starts = started()
            found = [
                e
                for e in worker_events(out)
                if e["event"] == "reduced" and e["world_size"] == 4 and e["pid"] in starts
            ]
            if restarted is not None:
                found = [e for e in found if e["pid"] not in restarted]
            newest = max(
                (int(starts[e["pid"]]["env"]["SHOAL_GENERATION"]) for e in found), default=0
            )
            return [e for e in found if starts[e["pid"]]["env"]["SHOAL_GENERATION"] == str(newest)]

        await wait_for(lambda: len(reduced_in_world_4()) == 4, 180, "a 4-rank all_reduce", out)
        first = reduced_in_world_4()
        assert sorted(e["rank"] for e in first) == [0, 1, 2, 3]
        assert {e["value"] for e in first} == {10.0}
        starts = started()
        envs = [starts[e["pid"]]["env"] for e in first]
        by_node: dict[str, list[dict[str, Any]]] = {}
        for env in envs:
            by_node.setdefault(urls[env["SHOAL_DAEMON_URL"]], []).append(env)
        assert sorted(by_node) == list(NAMES)
        assert {tuple(sorted(e["LOCAL_RANK"] for e in node)) for node in by_node.values()} == {
            ("0", "1")
        }
        assert sorted(node[0]["GROUP_RANK"] for node in by_node.values()) == ["0", "1"]
        for env in envs:
            assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("4", "2")
            assert (env["GROUP_WORLD_SIZE"], env["ROLE_WORLD_SIZE"]) == ("2", "4")
            assert env["RANK"] == env["ROLE_RANK"]
            assert int(env["RANK"]) == 2 * int(env["GROUP_RANK"]) + int(env["LOCAL_RANK"])
            assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
            assert env["OMP_NUM_THREADS"] == "1"
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"], e["SHOAL_GENERATION"]) for e in envs}) == 1

        victim = next(e for e in first if e["rank"] == 3)
        victim_node = urls[starts[victim["pid"]]["env"]["SHOAL_DAEMON_URL"]]
        old = {e["pid"] for e in first}
        os.kill(victim["pid"], signal.SIGKILL)

        await wait_for(
            lambda: len(reduced_in_world_4(restarted=old)) == 4, 120, "the group again", out
        )
        again = reduced_in_world_4(restarted=old)
        assert sorted(e["rank"] for e in again) == [0, 1, 2, 3]
        assert {e["value"] for e in again} == {10.0}
        starts = started()
        generation = int(envs[0]["SHOAL_GENERATION"])
        newer = {int(starts[event["pid"]]["env"]["SHOAL_GENERATION"]) for event in again}
        assert len(newer) == 1, "one group"
        assert newer.pop() > generation, "the whole group moved to a new generation"
        for pid in old:
            assert pid not in {e["pid"] for e in again}
        async with ClientSession() as session:
            url = next(url for url, name in urls.items() if name != victim_node)
            async with session.get(f"{url}/v1/training") as answer:
                restarts = (await answer.json())["restarts"]
        assert [r["reason"] for r in restarts if r["generation"] > generation][:1] == [
            "worker_exit"
        ], restarts
    finally:
        for daemon in daemons.values():
            await daemon.close()


RECORD_ENV = (
    "import json, os, sys, time\n"
    "keys = ['RANK', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'CUDA_VISIBLE_DEVICES', "
    "'CUDA_DEVICE_ORDER']\n"
    "line = json.dumps({k: os.environ.get(k) for k in keys})\n"
    "open(sys.argv[1], 'a').write(line + '\\n')\n"
    "time.sleep(60)\n"
)


async def test_the_workers_see_exactly_the_gpus_their_node_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FAKE_GPUS, "GPU-f0,GPU-f1,GPU-f2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    out = tmp_path / "envs.jsonl"
    settings = test_settings(
        tmp_path,
        "g",
        **FAST_ELECTION,
        role="training",
        gpus=[2, 0],
        training_command=(sys.executable, "-c", RECORD_ENV, str(out)),
    )
    async with NodeDaemon(settings):

        def both() -> bool:
            return out.exists() and len(out.read_text().splitlines()) >= 2

        await wait_for(both, 30, "both workers", out)
    envs = sorted(
        (json.loads(line) for line in out.read_text().splitlines()), key=lambda e: e["RANK"]
    )
    gpus = {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert envs == [
        {"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", **gpus},
        {"RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", **gpus},
    ]


JOIN_GROUP = (
    "import json, os, sys\n"
    "import torch\n"
    "import torch.distributed as dist\n"
    "from node.training.groups import join_group\n"
    "group = join_group(60)\n"
    "value = torch.tensor([float(group.rank + 1)])\n"
    "dist.all_reduce(value)\n"
    "line = {'local_rank': os.environ['LOCAL_RANK'], 'rank': group.rank, 'sum': value.item()}\n"
    "open(sys.argv[1], 'a').write(json.dumps(line) + '\\n')\n"
    "group.close()\n"
)


@pytest.mark.timeout(180)
async def test_elastic_workers_join_with_the_rendezvous_of_their_local_rank(
    tmp_path: Path,
) -> None:
    """An elastic-aware training command (join_group) run by the launcher as 2 workers: each
    asks the daemon for its own LOCAL_RANK's rendezvous, so they form one group of 2."""
    out = tmp_path / "joined.jsonl"
    root = str(Path(__file__).resolve().parents[2])
    settings = test_settings(
        tmp_path,
        "e",
        **FAST_ELECTION,
        role="training",
        backend="gloo",
        gpus="none",
        training_nproc=2,
        training_command=(sys.executable, "-c", JOIN_GROUP, str(out)),
        training_env={"PYTHONPATH": root, "TORCH_CPP_LOG_LEVEL": "ERROR"},
    )
    async with NodeDaemon(settings):

        def both() -> bool:
            return out.exists() and len(out.read_text().splitlines()) >= 2

        await wait_for(both, 120, "both local ranks to all-reduce", out)
    lines = sorted((json.loads(line) for line in out.read_text().splitlines()), key=str)
    assert lines == [
        {"local_rank": "0", "rank": 0, "sum": 3.0},
        {"local_rank": "1", "rank": 1, "sum": 3.0},
    ]
