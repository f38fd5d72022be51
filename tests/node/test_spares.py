"""Warm spare training processes (node.training.spares, shoal._spare): a spare warms, takes a
worker's command and runs it as the interpreter would (argv, environment, directory, output,
__main__, sys.path), a new one warms in its place; a command a spare cannot run leaves the pool
without spares; closing kills the spares not handed over."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from node.training.launcher import TrainingLauncher
from node.training.spares import SparePool
from shoal._spare import parse_command
from tests.node.test_launcher import CHILD, events, rdv, wait_until

SCRIPT = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "x": os.environ.get("X"), "cwd": os.getcwd(),
                  "name": __name__, "path0": sys.path[0], "spare": os.environ.get("SPARE")}))
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def base_env() -> dict[str, str]:
    return {**os.environ, "SHOAL_SPARE_PRELOAD": "json", "SPARE": "warm"}


async def ready(pool: SparePool, count: int, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while pool.ready_count < count:
            assert pool.unsupported is None, pool.unsupported
            await asyncio.sleep(0.02)


def test_commands_a_spare_can_run() -> None:
    assert parse_command(["python3", "-u", "train.py", "--x"]) is not None
    module = parse_command([sys.executable, "-m", "pkg.train", "a"])
    assert module is not None
    assert (module.module, module.args) == ("pkg.train", ("a",))
    for argv in (["bash", "train.sh"], ["python3", "-c", "pass"], ["python3", "-I", "t.py"]):
        assert parse_command(argv) is None, argv


async def test_a_spare_runs_the_workers_command_as_the_interpreter_would(tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    command = [sys.executable, "-u", str(script), "--steps", "3"]
    async with SparePool(command, tmp_path, base_env(), 1, tmp_path / "spare.log") as pool:
        pool.fill()
        await ready(pool, 1)
        spare = pool.take()
        assert spare is not None
        assert pool.take() is None
        workdir = tmp_path / "work"
        workdir.mkdir()
        log = tmp_path / "training.log"
        env = {**os.environ, "X": "42", "EXIT": "3"}
        proc = await spare.hand_over(command, env, workdir, log)
        assert await asyncio.wait_for(proc.wait(), 30) == 3
        seen = json.loads(log.read_text().strip().splitlines()[-1])
        assert seen == {
            "argv": [str(script), "--steps", "3"],
            "x": "42",
            "cwd": str(workdir),
            "name": "__main__",
            "path0": str(script.parent),
            "spare": None,
        }
        await ready(pool, 1)  # another warmed in its place


async def test_a_module_command_runs_with_the_directory_first_on_the_path(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(SCRIPT)
    command = [sys.executable, "-m", "mine", "go"]
    async with SparePool(command, tmp_path, base_env(), 1, tmp_path / "spare.log") as pool:
        pool.fill()
        await ready(pool, 1)
        spare = pool.take()
        assert spare is not None
        log = tmp_path / "training.log"
        proc = await spare.hand_over(command, dict(os.environ), tmp_path, log)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        seen = json.loads(log.read_text().strip().splitlines()[-1])
        assert (seen["argv"], seen["name"], seen["path0"]) == (
            [str(tmp_path / "mine.py"), "go"],
            "__main__",
            str(tmp_path),
        )


async def test_a_command_a_spare_cannot_run_leaves_the_pool_without_spares(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-c", "print('hi')"]
    async with SparePool(command, tmp_path, base_env(), 2, tmp_path / "spare.log") as pool:
        pool.fill()
        async with asyncio.timeout(60):
            while pool.unsupported is None:
                await asyncio.sleep(0.02)
        assert "not a python script" in pool.unsupported
        pool.fill()
        assert pool.take() is None
        assert pool.ready_count == 0


async def test_closing_kills_the_spares(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    pool = SparePool([sys.executable, str(script)], tmp_path, base_env(), 2, tmp_path / "s.log")
    pool.fill()
    await ready(pool, 2)
    procs = [spare.proc for spare in pool._spares]
    await pool.close()
    await pool.close()
    assert [proc.returncode for proc in procs] == [-9, -9]
    pool.fill()
    assert pool.ready_count == 0


@pytest.mark.parametrize("size", [0])
async def test_no_spares_when_none_are_asked_for(tmp_path: Path, size: int) -> None:
    async with SparePool([sys.executable, "t.py"], tmp_path, {}, size, tmp_path / "s.log") as pool:
        pool.fill()
        assert pool.unsupported == "training_spares is 0"
        assert pool.take() is None


async def test_the_launcher_starts_each_generations_worker_in_a_warm_spare(tmp_path: Path) -> None:
    """A restart takes the ready spare (the worker's pid is the spare's, its environment the
    generation's), and another warms for the next; the spare's preloaded state is there."""
    out = tmp_path / "events.jsonl"
    env = {**base_env(), "CHILD_OUT": str(out), "CHILD_MODE": "run"}
    command = [sys.executable, str(CHILD)]
    async with SparePool(command, tmp_path, env, 1, tmp_path / "spare.log") as pool:
        pool.fill()
        await ready(pool, 1)
        warm = [spare.proc.pid for spare in pool._spares]
        async with TrainingLauncher(
            command, tmp_path, tmp_path / "train.log", env, stop_timeout_s=5.0, spares=pool
        ) as runner:
            await runner.apply(rdv(generation=1))
            await wait_until(lambda: len(events(out, "start")) == 1)
            first = events(out, "start")[0]
            assert first["pid"] == warm[0]
            assert (first["env"]["SHOAL_GENERATION"], first["env"]["RANK"]) == ("1", "1")
            assert "SPARE" not in first["env"]  # the generation's environment, not the spare's
            await ready(pool, 1)
            warm = [spare.proc.pid for spare in pool._spares]
            await runner.apply(rdv(generation=2, rank=0))
            await wait_until(lambda: len(events(out, "start")) == 2)
            assert events(out, "start")[1]["pid"] == warm[0] != first["pid"]
            assert "=== shoal: generation 2" in (tmp_path / "train.log").read_text()


async def test_without_a_ready_spare_the_launcher_starts_a_process_and_warms_one(
    tmp_path: Path,
) -> None:
    out = tmp_path / "events.jsonl"
    env = {**base_env(), "CHILD_OUT": str(out), "CHILD_MODE": "run"}
    command = [sys.executable, str(CHILD)]
    pool = SparePool(command, tmp_path, env, 1, tmp_path / "spare.log")
    async with (
        pool,
        TrainingLauncher(
            command, tmp_path, tmp_path / "train.log", env, stop_timeout_s=5.0, spares=pool
        ) as runner,
    ):
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: len(events(out, "start")) == 1)
        await ready(pool, 1)
        assert events(out, "start")[0]["pid"] not in [s.proc.pid for s in pool._spares]


async def test_a_warming_spare_is_taken_and_runs_the_command_once_its_imports_are_done(
    tmp_path: Path,
) -> None:
    """With no ready spare, the launcher takes one still warming (sooner than a new process);
    stopping it before it is ready leaves the pool able to warm others."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    command = [sys.executable, str(script)]
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(1.5)\n")  # found in its cwd
    slow = {**base_env(), "SHOAL_SPARE_PRELOAD": "slowmod"}
    async with SparePool(command, tmp_path, slow, 1, tmp_path / "spare.log") as pool:
        pool.fill()
        async with asyncio.timeout(30):
            while not pool._spares:
                await asyncio.sleep(0.01)
        spare = pool.take()
        assert spare is not None
        assert not spare.ready.is_set()
        log = tmp_path / "training.log"
        proc = await spare.hand_over(command, {**os.environ, "X": "7"}, tmp_path, log)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        assert json.loads(log.read_text().strip().splitlines()[-1])["x"] == "7"
        stopped = pool.take()  # the one warming in its place, stopped before it is ready
        assert stopped is not None
        stopped.kill()
        await stopped.proc.wait()
        await asyncio.sleep(0.2)
        assert pool.unsupported is None
        await ready(pool, 1)
