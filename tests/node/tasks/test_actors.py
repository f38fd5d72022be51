"""Named actors on the `shoal` backend against a real daemon: 1,000 concurrent get-or-create
calls from 8 processes make exactly one actor; a handle names one incarnation and a call after
its host died raises ActorDiedError, never reaching a newer incarnation."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.tasks import ActorDiedError, ShoalActor, TaskError
from node.tasks.shoal import ShoalContext
from tests.node.jobs.client_daemon import ROOT, ServedNode, served_node
from tests.node.tasks.contract import InitCounting

PROCESSES = 8
CALLS_PER_PROCESS = 125


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedNode]:
    with served_node(tmp_path_factory.mktemp("actors")) as served:
        yield served


@pytest.fixture
def ctx(node: ServedNode) -> Iterator[ShoalContext]:
    context = ShoalContext(
        node.url,
        config_file=str(node.config_file),
        workers_per_node=1,
        env={"PYTHONPATH": str(ROOT)},
    )
    try:
        yield context
    finally:
        context.close()


@pytest.mark.timeout(300)
def test_concurrent_get_if_exists_from_8_processes_make_one_actor(
    node: ServedNode, ctx: ShoalContext, tmp_path: Path
) -> None:
    marker = tmp_path / "instances"
    marker.touch()
    name = "one-of-many"
    argv = [sys.executable, "-m", "tests.node.tasks.claim_proc", node.url, str(node.config_file)]
    argv += [name, str(CALLS_PER_PROCESS), str(marker)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(PROCESSES)
    ]
    results: list[dict[str, Any]] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["count"] for r in results) == PROCESSES * CALLS_PER_PROCESS
    handles = {tuple(h) for r in results for h in r["handles"]}
    assert len(handles) == 1, handles
    assert next(iter(handles))[1] == 1
    assert len(marker.read_text().split()) == 1
    assert sorted(r["calls"] for r in results) == list(range(1, PROCESSES + 1))
    handle = ctx.create_actor(InitCounting, str(marker), name=name, get_if_exists=True)
    assert ctx.get(handle.incr.remote(), timeout_s=60) == PROCESSES + 1
    os.kill(ctx.get(handle.host_pid.remote(), timeout_s=60), signal.SIGKILL)


@pytest.mark.timeout(300)
def test_killing_the_actor_host_raises_actor_died_and_never_rebinds(
    ctx: ShoalContext, tmp_path: Path
) -> None:
    marker = tmp_path / "instances"
    name = "short-lived"
    handle = ctx.create_actor(InitCounting, str(marker), name=name, get_if_exists=True)
    assert ctx.get(handle.incr.remote(), timeout_s=60) == 1
    copy = pickle.loads(pickle.dumps(handle))
    assert isinstance(copy, ShoalActor)
    assert (copy.name, copy.incarnation) == (name, 1)
    host = ctx.get(handle.host_pid.remote(), timeout_s=60)
    os.kill(host, signal.SIGKILL)  # the actor's host (its job) dies as with its node
    with pytest.raises(ActorDiedError, match="incarnation 1"):
        ctx.get(handle.incr.remote(), timeout_s=30)
    reborn = ctx.create_actor(InitCounting, str(marker), name=name, get_if_exists=True)
    assert reborn.incarnation == 2
    assert ctx.get(reborn.incr.remote(), timeout_s=60) == 1
    with pytest.raises(ActorDiedError):
        ctx.get(copy.incr.remote(), timeout_s=30)
    stale = ShoalActor(ctx, name, 1, reborn.address)  # a live address, a dead incarnation
    with pytest.raises(ActorDiedError, match="registry holds incarnation 2"):
        ctx.get(stale.incr.remote(), timeout_s=30)
    with pytest.raises(ActorDiedError):
        ctx.get(handle.incr.remote(), timeout_s=30)
    os.kill(ctx.get(reborn.host_pid.remote(), timeout_s=60), signal.SIGKILL)


def test_a_task_that_kills_its_worker_fails_and_the_others_go_on(node: ServedNode) -> None:
    context = ShoalContext(
        node.url,
        config_file=str(node.config_file),
        workers_per_node=2,
        env={"PYTHONPATH": str(ROOT)},
    )
    try:
        doomed = context.run(os._exit, 3)
        with pytest.raises(TaskError, match="exit code 3"):
            context.get(doomed, timeout_s=60)
        assert context.get(context.run(pow, 4, 2), timeout_s=60) == 16
    finally:
        context.close()
