"""Three training processes form a gloo group from their daemons' rendezvous; after rank 0 is
SIGKILLed and the rendezvous moves to a 2-rank generation, the survivors re-form it in place;
when a newcomer's node joins, they notice through changed() and grow to 3 ranks again.

The processes train on the CPU on every host: CUDA is hidden from them, so on a GPU host the
ranks of this one machine never share (or claim) its GPU."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from node.training.rendezvous import Rendezvous
from tests.node.groups_fake_daemon import FakeDaemon, free_port

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).with_name("groups_worker.py"))
COLLECTIVE_S = 5.0
FLIP_DELAY_S = 0.5
REFORM_LIVENESS_S = 60.0
"""How long the survivors may take to re-form at all (the figure itself is printed, not
asserted: bench/election_bench.py measures it)."""
"""Time between the kill and the new rendezvous: the daemon's failure detection, simulated."""


@dataclass
class Worker:
    proc: asyncio.subprocess.Process
    events: list[dict[str, Any]] = field(default_factory=list)

    def first(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        return next((event for event in self.events if predicate(event)), None)


def rendezvous(rank: int, world_size: int, port: int, generation: int) -> Rendezvous:
    return Rendezvous(rank, world_size, "127.0.0.1", port, "gloo", generation, 1, generation)


def reduced(generation: int) -> Callable[[dict[str, Any]], bool]:
    return lambda event: event["event"] == "reduced" and event["generation"] == generation


async def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        await asyncio.sleep(0.02)


async def read_events(worker: Worker) -> None:
    assert worker.proc.stdout is not None
    async for line in worker.proc.stdout:
        worker.events.append(json.loads(line))


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Callable[[str, int], Any]]:
    workers: list[Worker] = []
    readers: list[asyncio.Task[None]] = []
    path = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        "TORCH_CPP_LOG_LEVEL": "ERROR",
        "CUDA_VISIBLE_DEVICES": "",  # CPU trainers: on a GPU host, none may claim a device
    }

    async def start(daemon_url: str, index: int) -> Worker:
        with (tmp_path / f"worker{index}.err").open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                WORKER,
                daemon_url,
                str(COLLECTIVE_S),
                cwd=ROOT,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        worker = Worker(proc)
        workers.append(worker)
        readers.append(asyncio.create_task(read_events(worker)))
        return worker

    yield start
    for worker in workers:
        if worker.proc.returncode is None:
            worker.proc.kill()
        await worker.proc.wait()
    await asyncio.gather(*readers)


async def test_survivors_reform_without_restarting_and_grow_when_a_node_joins(
    spawn: Callable[[str, int], Any], tmp_path: Path
) -> None:
    first_port, second_port = free_port(), free_port()
    daemons = [FakeDaemon(rendezvous(rank, 3, first_port, 1)) for rank in range(3)]
    try:
        workers: list[Worker] = [await spawn(d.url, index) for index, d in enumerate(daemons)]

        def stderr() -> str:
            paths = sorted(tmp_path.glob("worker*.err"))
            return "\n".join(path.read_text()[-2000:] for path in paths)

        try:
            await wait_until(
                lambda: all(worker.first(reduced(1)) for worker in workers), 40, "3-rank group"
            )
        except AssertionError:
            pytest.fail(f"the 3-rank group did not form; stderr:\n{stderr()}")
        for rank, worker in enumerate(workers):
            event = worker.first(reduced(1))
            assert event is not None
            assert (event["rank"], event["world_size"], event["value"]) == (rank, 3, 6.0)

        master, survivors = workers[0], workers[1:]
        pids = [worker.proc.pid for worker in survivors]
        master.proc.kill()
        killed_at = time.monotonic()
        await asyncio.sleep(FLIP_DELAY_S)
        daemons[1].answer = rendezvous(0, 2, second_port, 2)
        daemons[2].answer = rendezvous(1, 2, second_port, 2)
        flipped_at = time.monotonic()

        try:
            await wait_until(
                lambda: all(worker.first(reduced(2)) for worker in survivors),
                REFORM_LIVENESS_S,
                "re-formation",
            )
        except AssertionError:
            pytest.fail(
                f"the survivors did not re-form in {REFORM_LIVENESS_S:g} s; stderr:\n{stderr()}"
            )
        firsts = [worker.first(reduced(2)) for worker in survivors]
        assert all(event is not None for event in firsts)
        reformed_at = max(event["t"] for event in firsts if event is not None)
        for new_rank, (worker, event, pid) in enumerate(zip(survivors, firsts, pids, strict=True)):
            assert event is not None
            assert (event["rank"], event["world_size"], event["value"]) == (new_rank, 2, 3.0)
            assert event["pid"] == pid
            assert worker.proc.returncode is None
        print(
            f"\nre-formation: kill -> first 2-rank all_reduce {reformed_at - killed_at:.3f} s "
            f"(new rendezvous {flipped_at - killed_at:.3f} s after the kill, "
            f"then {reformed_at - flipped_at:.3f} s to the first all_reduce)"
        )

        third_port = free_port()
        daemons.append(FakeDaemon(rendezvous(2, 3, third_port, 3)))
        newcomer = await spawn(daemons[3].url, 3)
        await wait_until(
            lambda: newcomer.first(lambda e: e["event"] == "joining") is not None, 40, "newcomer"
        )
        daemons[1].answer = rendezvous(0, 3, third_port, 3)
        daemons[2].answer = rendezvous(1, 3, third_port, 3)
        grown = [*survivors, newcomer]
        await wait_until(lambda: all(worker.first(reduced(3)) for worker in grown), 30, "growth")
        for rank, worker in enumerate(grown):
            event = worker.first(reduced(3))
            assert event is not None
            assert (event["rank"], event["world_size"], event["value"]) == (rank, 3, 6.0)
        assert [worker.proc.pid for worker in survivors] == pids
    finally:
        for daemon in daemons:
            daemon.close()
