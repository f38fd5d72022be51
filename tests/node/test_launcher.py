"""The training launcher: env of the child, restarts per generation, stops, backoff and close."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from health import HealthStatus
from node.errors import LauncherError
from node.training.launcher import TrainingLauncher, launcher_check
from node.training.rendezvous import Rendezvous
from node.training.torchrun import training_env
from node.training.workers import LauncherState, restart_delay_s

GRANDCHILD = re.compile(r"^grandchild (\d+)$", re.MULTILINE)
CHILD = str(Path(__file__).with_name("groups_launcher_child.py"))


def rdv(generation: int = 1, rank: int | None = 1, **changes: Any) -> Rendezvous:
    fields: dict[str, Any] = {
        "rank": rank,
        "world_size": 2,
        "master_addr": "127.0.0.1",
        "master_port": 29500 + generation,
        "backend": "gloo",
        "generation": generation,
        "term": 1,
        "plan_version": generation,
    }
    return Rendezvous(**(fields | changes))


def events(out: Path, kind: str | None = None) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return [line for line in lines if kind is None or line["event"] == kind]


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


def launcher(
    tmp_path: Path,
    out: Path,
    mode: str = "run",
    stop_timeout_s: float = 5.0,
    child_env: dict[str, str] | None = None,
    **kw: Any,
) -> TrainingLauncher:
    env = {"PATH": os.environ["PATH"], "CHILD_OUT": str(out), "CHILD_MODE": mode}
    return TrainingLauncher(
        [sys.executable, CHILD],
        tmp_path,
        tmp_path / "logs" / "train.log",
        env | {"CHILD_EXTRA": "kept"} | (child_env or {}),
        stop_timeout_s=stop_timeout_s,
        backoff_s=kw.pop("backoff_s", 0.1),
        max_backoff_s=kw.pop("max_backoff_s", 1.0),
        **kw,
    )


def test_training_env_sets_the_rendezvous_and_keeps_the_base() -> None:
    env = training_env(rdv(generation=7, rank=1), {"PATH": "/bin", "RANK": "stale"})
    assert env == {
        "PATH": "/bin",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29507",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "1",
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": "2",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "shoal-gen7",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "SHOAL_GENERATION": "7",
        "SHOAL_BACKEND": "gloo",
    }


def test_training_env_refuses_a_rendezvous_without_rank() -> None:
    with pytest.raises(LauncherError, match="generation 3 gives this node no rank"):
        training_env(rdv(generation=3, rank=None), {})


def test_restart_delay_doubles_up_to_the_cap() -> None:
    delays = [restart_delay_s(failures, 0.5, 3.0) for failures in range(1, 6)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_an_empty_command_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match="empty"):
        TrainingLauncher([], tmp_path, tmp_path / "log", stop_timeout_s=1.0)


async def test_starts_the_child_with_the_env_in_workdir_and_logs(tmp_path: Path, out: Path) -> None:
    async with launcher(tmp_path, out) as runner:
        await runner.apply(rdv(generation=4, rank=1))
        await wait_until(lambda: len(events(out, "start")) == 1)
        start = events(out, "start")[0]
        assert start["env"] == {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29504",
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2",
            "ROLE_RANK": "1",
            "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": "2",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "4",
            "TORCHELASTIC_RUN_ID": "shoal-gen4",
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "OMP_NUM_THREADS": None,
            "SHOAL_GENERATION": "4",
        }
        assert start["extra"] == "kept"
        assert Path(start["cwd"]) == tmp_path
        status = runner.status
        assert (status.state, status.generation, status.pid) == (
            LauncherState.RUNNING,
            4,
            start["pid"],
        )
        log_path = tmp_path / "logs" / "train.log"
        await wait_until(lambda: f"child {start['pid']} mode run" in log_path.read_text())
        assert (
            "=== shoal: generation 4 rank 1/2 local rank 0/1 restart 0 master 127.0.0.1:29504"
            in log_path.read_text()
        )


async def test_same_generation_keeps_the_child_and_a_new_one_restarts_it(
    tmp_path: Path, out: Path
) -> None:
    async with launcher(tmp_path, out) as runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: len(events(out, "start")) == 1)
        first = events(out, "start")[0]["pid"]
        await runner.apply(rdv(generation=1, term=2, plan_version=9))
        assert runner.status.pid == first
        assert runner.status.state is LauncherState.RUNNING

        await runner.apply(rdv(generation=2, rank=0))
        await wait_until(lambda: len(events(out, "start")) == 2)
        assert [event["pid"] for event in events(out, "term")] == [first]
        assert gone(first)
        second = events(out, "start")[1]
        assert second["env"]["SHOAL_GENERATION"] == "2"
        assert second["env"]["RANK"] == "0"
        assert runner.status.pid == second["pid"] != first


@pytest.mark.parametrize("no_rank", [None, rdv(generation=2, rank=None)])
async def test_no_rank_stops_the_child(tmp_path: Path, out: Path, no_rank: Rendezvous) -> None:
    async with launcher(tmp_path, out) as runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: len(events(out, "start")) == 1)
        pid = events(out, "start")[0]["pid"]
        await runner.apply(no_rank)
        assert [event["pid"] for event in events(out, "term")] == [pid]
        assert gone(pid)
        status = runner.status
        assert (status.state, status.pid, status.generation) == (LauncherState.IDLE, None, None)


async def test_crashed_child_restarts_with_backoff_only_while_current(
    tmp_path: Path, out: Path
) -> None:
    async with launcher(tmp_path, out, mode="crash", backoff_s=0.1, max_backoff_s=0.4) as runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: len(events(out, "start")) >= 4)
        times = [event["t"] for event in events(out, "start")]
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        for gap, delay_s in zip(gaps, [0.1, 0.2, 0.4], strict=False):
            assert gap >= delay_s
        assert runner.status.last_exit_code == 3
        counts = [int(event["env"]["TORCHELASTIC_RESTART_COUNT"]) for event in events(out, "start")]
        assert counts == list(range(len(counts)))

        await runner.apply(rdv(generation=2))
        generation_2 = len(events(out, "start"))
        await wait_until(lambda: len(events(out, "start")) >= generation_2 + 2)
        later = events(out, "start")[generation_2:]
        assert {event["env"]["SHOAL_GENERATION"] for event in later} == {"2"}
        assert [event["env"]["TORCHELASTIC_RESTART_COUNT"] for event in later[:2]] == ["0", "1"]

        await runner.apply(None)
        stopped_at = len(events(out, "start"))
        await asyncio.sleep(0.6)
        assert len(events(out, "start")) == stopped_at
        assert runner.status.state is LauncherState.IDLE


async def test_finished_child_is_not_restarted_until_a_new_generation(
    tmp_path: Path, out: Path
) -> None:
    async with launcher(tmp_path, out, mode="finish") as runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: runner.status.state is LauncherState.DONE)
        assert runner.status.last_exit_code == 0
        await runner.apply(rdv(generation=1, plan_version=5))
        await asyncio.sleep(0.3)
        assert len(events(out, "start")) == 1
        await runner.apply(rdv(generation=2))
        await wait_until(lambda: len(events(out, "start")) == 2)


async def test_child_ignoring_sigterm_is_killed_after_stop_timeout(
    tmp_path: Path, out: Path
) -> None:
    async with launcher(tmp_path, out, mode="stubborn", stop_timeout_s=0.3) as runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: len(events(out, "start")) == 1)
        pid = events(out, "start")[0]["pid"]
        started = time.monotonic()
        await runner.apply(None)
        assert time.monotonic() - started >= 0.3
        assert gone(pid)
        assert runner.status.last_exit_code == -9


async def test_a_stopped_child_takes_its_sigterm_without_waiting_for_the_kill(
    tmp_path: Path, out: Path
) -> None:
    """A hung worker (SIGSTOP) is stopped by the SIGTERM of a restart, not its SIGKILL."""
    async with launcher(tmp_path, out, stop_timeout_s=5.0) as runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: len(events(out, "start")) == 1)
        os.kill(events(out, "start")[0]["pid"], signal.SIGSTOP)
        await runner.apply(None)
        assert runner.status.last_exit_code == 0, "its SIGTERM handler ran: not killed"


async def test_stop_reaches_the_childs_own_children(tmp_path: Path, out: Path) -> None:
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('grandchild', p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    log_path = tmp_path / "train.log"

    def grandchild_pid() -> int | None:
        found = GRANDCHILD.findall(log_path.read_text()) if log_path.exists() else []
        return int(found[0]) if found else None

    runner = TrainingLauncher([sys.executable, "-c", script], tmp_path, log_path, stop_timeout_s=5)
    async with runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: grandchild_pid() is not None)
    grandchild = grandchild_pid()
    assert grandchild is not None
    await wait_until(lambda: gone(grandchild), timeout_s=5.0)


async def test_close_stops_the_child_and_is_final(tmp_path: Path, out: Path) -> None:
    runner = launcher(tmp_path, out)
    await runner.apply(rdv(generation=1))
    await wait_until(lambda: len(events(out, "start")) == 1)
    await runner.close()
    await runner.close()
    assert len(events(out, "term")) == 1
    assert runner.status.state is LauncherState.CLOSED
    assert runner.status.pid is None
    with pytest.raises(LauncherError, match="closed"):
        await runner.apply(rdv(generation=2))


@pytest.mark.parametrize("in_place", [False, True])
async def test_a_command_that_cannot_start_is_retried_and_reported(
    tmp_path: Path, in_place: bool
) -> None:
    missing = tmp_path / "no-such-trainer"
    runner = TrainingLauncher(
        [str(missing)],
        tmp_path,
        tmp_path / "log",
        stop_timeout_s=1.0,
        backoff_s=0.05,
        max_failures=3,
        in_place=in_place,
    )
    async with runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: runner.status.last_error is not None)
        error = runner.status.last_error
        assert error is not None
        assert str(missing) in error
        assert runner.status.state is LauncherState.BACKOFF
        await wait_until(lambda: runner.status.state is LauncherState.GAVE_UP)
        assert runner.status.failures == 3


async def test_a_child_that_keeps_failing_gives_up_and_reports_it(
    tmp_path: Path, out: Path
) -> None:
    reasons: list[str] = []
    runner = launcher(
        tmp_path,
        out,
        mode="crash",
        backoff_s=0.05,
        max_backoff_s=0.1,
        max_failures=3,
        failure_window_s=60.0,
        on_give_up=reasons.append,
    )
    check = launcher_check(runner)
    async with runner:
        assert (await check()).status is HealthStatus.HEALTHY
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: runner.status.state is LauncherState.BACKOFF)
        backoff = await check()
        assert backoff.status is HealthStatus.DEGRADED
        assert "generation 1: training command exited 3" in backoff.message
        await wait_until(lambda: runner.status.state is LauncherState.GAVE_UP)
        await asyncio.sleep(0.3)  # no further restart once it gave up
        assert len(events(out, "start")) == 3
        assert reasons == [
            "training command failed 3 times in 60 s; last: generation 1: training command exited 3"
        ]
        result = await check()
        assert result.status is HealthStatus.DEGRADED
        assert result.message == f"gave_up: {reasons[0]}"
        assert result.metrics["failures"] == 3.0
        # without a rank it stays given up (still degraded) until forgiven or a new generation
        await runner.apply(None)
        given_up = runner.status
        assert given_up.state is LauncherState.GAVE_UP
        assert (await check()).status is HealthStatus.DEGRADED
        runner.forgive()
        forgiven = runner.status
        assert forgiven.state is LauncherState.IDLE
        assert (await check()).status is HealthStatus.HEALTHY
        # a new generation is a fresh start
        await runner.apply(rdv(generation=2))
        await wait_until(lambda: len(events(out, "start")) >= 4)
        assert runner.status.generation == 2
        assert runner.status.state is not LauncherState.GAVE_UP


async def test_a_restart_of_the_group_keeps_counting_the_failures(
    tmp_path: Path, out: Path
) -> None:
    """Each failure restarts the whole group in a new generation (worker_exit): that new
    generation keeps the failures, so a command that keeps failing still gives up."""
    failed: list[tuple[int, str]] = []
    runner = launcher(
        tmp_path,
        out,
        mode="crash",
        backoff_s=30.0,
        max_failures=3,
        failure_window_s=60.0,
        on_failure=lambda generation, error: failed.append((generation, error)),
    )
    async with runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: runner.status.failures == 1)
        await runner.apply(rdv(generation=2), keep_failures=True)
        await wait_until(lambda: runner.status.failures == 2)
        await runner.apply(rdv(generation=3), keep_failures=True)
        await wait_until(lambda: runner.status.state is LauncherState.GAVE_UP)
        assert [generation for generation, _ in failed] == [1, 2, 3]
        assert failed[0][1] == "generation 1: training command exited 3"
        await runner.apply(rdv(generation=4))  # a new group that is no restart starts afresh
        await wait_until(lambda: runner.status.state is LauncherState.BACKOFF)
        assert runner.status.failures == 1


async def test_failures_outside_the_window_do_not_add_up(tmp_path: Path, out: Path) -> None:
    ticks = itertools.count(step=100.0)
    runner = launcher(
        tmp_path,
        out,
        mode="crash",
        backoff_s=0.02,
        max_backoff_s=0.02,
        max_failures=2,
        failure_window_s=60.0,
        clock=lambda: next(ticks),
    )
    async with runner:
        await runner.apply(rdv(generation=1))
        await wait_until(lambda: len(events(out, "start")) >= 5)
        assert runner.status.state is not LauncherState.GAVE_UP
        assert runner.status.failures <= 1


def test_failure_bounds_are_checked(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match="max_failures"):
        TrainingLauncher(["x"], tmp_path, tmp_path / "log", stop_timeout_s=1.0, max_failures=0)


def node_rdv(generation: int = 1, node_rank: int = 1, **changes: Any) -> Rendezvous:
    """Node `node_rank` of 2 nodes with 2 local ranks each (world 4), as its daemon answers
    for local rank 0."""
    fields: dict[str, Any] = {
        "rank": 2 * node_rank,
        "world_size": 4,
        "local_rank": 0,
        "local_world_size": 2,
        "node_rank": node_rank,
        "nnodes": 2,
    }
    return rdv(generation=generation, **(fields | changes))


async def test_runs_one_worker_per_local_rank_with_torchruns_env_and_own_logs(
    tmp_path: Path, out: Path
) -> None:
    async with launcher(tmp_path, out) as runner:
        await runner.apply(node_rdv(generation=3, node_rank=1))
        await wait_until(lambda: len(events(out, "start")) == 2)
        starts = sorted(events(out, "start"), key=lambda event: event["env"]["LOCAL_RANK"])
        for local_rank, start in enumerate(starts):
            assert start["env"] == {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29503",
                "RANK": str(2 + local_rank),
                "WORLD_SIZE": "4",
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": "1",
                "GROUP_WORLD_SIZE": "2",
                "ROLE_RANK": str(2 + local_rank),
                "ROLE_NAME": "default",
                "ROLE_WORLD_SIZE": "4",
                "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "4",
                "TORCHELASTIC_RUN_ID": "shoal-gen3",
                "TORCHELASTIC_USE_AGENT_STORE": "False",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                "OMP_NUM_THREADS": "1",
                "SHOAL_GENERATION": "3",
            }
        status = runner.status
        assert [(w.local_rank, w.rank, w.pid) for w in status.workers] == [
            (0, 2, starts[0]["pid"]),
            (1, 3, starts[1]["pid"]),
        ]
        assert status.pid == starts[0]["pid"]
        logs = [tmp_path / "logs" / "train.log", tmp_path / "logs" / "train.1.log"]
        for local_rank, (path, start) in enumerate(zip(logs, starts, strict=True)):
            await wait_until(lambda p=path, s=start: f"child {s['pid']} mode" in p.read_text())
            header = f"rank {2 + local_rank}/4 local rank {local_rank}/2 restart 0 master"
            assert header in path.read_text()


async def test_a_sigkilled_worker_restarts_every_worker_of_the_node_counted_once(
    tmp_path: Path, out: Path
) -> None:
    async with launcher(tmp_path, out, backoff_s=0.05) as runner:
        await runner.apply(node_rdv(generation=1, node_rank=0))
        await wait_until(lambda: len(events(out, "start")) == 2)
        first = {event["env"]["LOCAL_RANK"]: event["pid"] for event in events(out, "start")}
        os.kill(first["1"], signal.SIGKILL)
        await wait_until(lambda: len(events(out, "start")) == 4)
        assert [event["pid"] for event in events(out, "term")] == [first["0"]]
        assert gone(first["0"])
        again = events(out, "start")[2:]
        assert sorted(event["env"]["LOCAL_RANK"] for event in again) == ["0", "1"]
        assert {event["env"]["TORCHELASTIC_RESTART_COUNT"] for event in again} == {"1"}
        status = runner.status
        assert (status.failures, status.restarts, status.last_exit_code) == (1, 1, -9)
        assert status.last_error == (
            "generation 1: training command exited -9 (local rank 1, rank 1)"
        )
        assert [w.pid for w in status.workers] == [
            next(e["pid"] for e in again if e["env"]["LOCAL_RANK"] == str(local_rank))
            for local_rank in (0, 1)
        ]


async def test_workers_failing_together_count_one_failure_toward_giving_up(
    tmp_path: Path, out: Path
) -> None:
    reasons: list[str] = []
    runner = launcher(
        tmp_path,
        out,
        mode="crash",
        backoff_s=0.02,
        max_backoff_s=0.02,
        max_failures=2,
        on_give_up=reasons.append,
    )
    async with runner:
        await runner.apply(node_rdv(generation=1))
        await wait_until(lambda: runner.status.state is LauncherState.GAVE_UP)
        status = runner.status
        assert (status.starts, status.restarts, status.failures) == (2, 1, 2), (
            "two starts of both workers, each failure counted once"
        )
        assert reasons[0].startswith("training command failed 2 times")
        # A worker may be stopped (its sibling crashed first) before it records its start.
        starts = events(out, "start")
        assert {event["env"]["TORCHELASTIC_RESTART_COUNT"] for event in starts} <= {"0", "1"}
        assert {event["env"]["TORCHELASTIC_MAX_RESTARTS"] for event in starts} == {"1"}


async def test_a_worker_that_finishes_waits_for_the_others(tmp_path: Path, out: Path) -> None:
    async with launcher(tmp_path, out, child_env={"CHILD_MODE_0": "finish"}) as runner:
        await runner.apply(node_rdv(generation=1))
        await wait_until(lambda: len(events(out, "start")) == 2)
        await wait_until(lambda: runner.status.workers[0].exit_code == 0)
        status = runner.status
        assert status.state is LauncherState.RUNNING
        assert status.pid is None
        assert status.workers[1].pid is not None
        os.kill(status.workers[1].pid, signal.SIGTERM)
        await wait_until(lambda: runner.status.state is LauncherState.DONE)
        assert len(events(out, "start")) == 2


def starts_of(out: Path, local_rank: str) -> list[dict[str, Any]]:
    return [event for event in events(out, "start") if event["env"]["LOCAL_RANK"] == local_rank]


async def test_in_place_a_new_generation_is_handed_to_the_running_workers(
    tmp_path: Path, out: Path
) -> None:
    async with launcher(tmp_path, out, in_place=True) as runner:
        await runner.apply(node_rdv(generation=1, node_rank=0))
        await wait_until(lambda: len(events(out, "start")) == 2)
        pids = [w.pid for w in runner.status.workers]
        await runner.apply(node_rdv(generation=2, node_rank=1))  # its ranks move: 2 and 3
        await asyncio.sleep(0.5)
        assert len(events(out, "start")) == 2
        assert not events(out, "term")
        status = runner.status
        assert status.generation == 2
        assert [(w.rank, w.pid) for w in status.workers] == [(2, pids[0]), (3, pids[1])]
        # a different number of local ranks cannot be handed over: they start again
        await runner.apply(node_rdv(generation=3, node_rank=0, local_world_size=1, rank=0))
        await wait_until(lambda: len(events(out, "start")) == 3)
        assert sorted(event["pid"] for event in events(out, "term")) == sorted(pids)


async def test_in_place_a_failed_worker_starts_again_alone_for_the_next_generation(
    tmp_path: Path, out: Path
) -> None:
    failed: list[tuple[int, str]] = []
    async with launcher(
        tmp_path,
        out,
        in_place=True,
        child_env={"CHILD_MODE_1": "crash-once"},
        on_failure=lambda generation, error: failed.append((generation, error)),
    ) as runner:
        await runner.apply(node_rdv(generation=4, node_rank=0))
        await wait_until(lambda: len(starts_of(out, "1")) == 2)
        first, again = starts_of(out, "1")
        assert (first["after"], again["after"]) == (None, "4")
        assert again["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert len(starts_of(out, "0")) == 1
        assert not events(out, "term")
        assert failed == [
            (4, f"generation 4: training command exited 3 (local rank 1, pid {first['pid']})")
        ]
        status = runner.status
        assert (status.failures, status.restarts, status.state) == (1, 1, LauncherState.RUNNING)
        assert [w.pid for w in status.workers] == [starts_of(out, "0")[0]["pid"], again["pid"]]


async def test_in_place_a_stopped_worker_is_killed_and_started_in_the_handed_generation(
    tmp_path: Path, out: Path
) -> None:
    failed: list[tuple[int, str]] = []
    async with launcher(
        tmp_path,
        out,
        in_place=True,
        on_failure=lambda generation, error: failed.append((generation, error)),
    ) as runner:
        await runner.apply(node_rdv(generation=1, node_rank=0))
        await wait_until(lambda: len(events(out, "start")) == 2)
        hung = starts_of(out, "1")[0]["pid"]
        os.kill(hung, signal.SIGSTOP)
        stat = Path(f"/proc/{hung}/stat")
        await wait_until(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T")
        await runner.apply(node_rdv(generation=2, node_rank=0))
        await wait_until(lambda: len(starts_of(out, "1")) == 2)
        assert gone(hung)
        again = starts_of(out, "1")[1]
        assert (again["after"], again["env"]["SHOAL_GENERATION"]) == (None, "2")
        assert len(starts_of(out, "0")) == 1
        assert failed == []
        assert runner.status.failures == 0


async def test_in_place_giving_up_stops_every_worker(tmp_path: Path, out: Path) -> None:
    reasons: list[str] = []
    async with launcher(
        tmp_path,
        out,
        in_place=True,
        child_env={"CHILD_MODE_1": "crash"},
        max_failures=2,
        on_give_up=reasons.append,
    ) as runner:
        await runner.apply(node_rdv(generation=1, node_rank=0))
        await wait_until(lambda: runner.status.state is LauncherState.GAVE_UP)
        survivor = starts_of(out, "0")[0]["pid"]
        await wait_until(lambda: gone(survivor))
        assert len(starts_of(out, "1")) == 2
        assert len(starts_of(out, "0")) == 1
        assert reasons
        assert "failed 2 times" in reasons[0]
