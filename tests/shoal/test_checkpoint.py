"""shoal.checkpoint: the content hash is the daemon's, DCP's metadata gets a served twin, a state
saved by 6 ranks is restored resharded by 4 (no daemon: a shared directory), a write that fails
in the background is raised at the next save, and one rank's save and restore go through a real
daemon (reported, committed, prepared, recorded)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from node import NodeDaemon
from shoal._checkpoint_files import (
    METADATA,
    METADATA_COPY,
    file_digest,
    finished_steps,
    link_metadata,
    parse_step_directory,
    step_directory,
)
from shoal._daemon import DaemonClient
from shoal.checkpoint import Checkpointer, committed_candidates
from shoal.errors import CheckpointError
from shoal.place import RankPlace
from sync.files.manifest import hash_fd
from tests.cluster.cluster import free_port
from tests.node.daemons import FAST_ELECTION, test_settings

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).with_name("checkpoint_worker.py"))
PIECE = 4096


@pytest.mark.parametrize("size", [0, 1, PIECE - 1, PIECE, PIECE + 1, 2 * PIECE, 5 * PIECE + 7])
def test_the_content_hash_is_the_one_sync_checks(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    digest = file_digest(path, PIECE)
    fd = os.open(path, os.O_RDONLY)
    try:
        read, pieces = hash_fd(fd, PIECE)
    finally:
        os.close(fd)
    from sync.files.manifest import content_hash

    assert (digest.size, digest.hash) == (read, content_hash(pieces))
    assert digest.pieces == (tuple(p.hex() for p in pieces) if len(pieces) > 1 else ())


def test_the_metadata_gets_a_name_the_file_routes_serve(tmp_path: Path) -> None:
    (tmp_path / METADATA).write_bytes(b"one")
    link_metadata(tmp_path, source=METADATA, target=METADATA_COPY)
    assert (tmp_path / METADATA_COPY).read_bytes() == b"one"
    (tmp_path / METADATA).unlink()
    (tmp_path / METADATA).write_bytes(b"two")
    link_metadata(tmp_path, source=METADATA, target=METADATA_COPY)
    assert (tmp_path / METADATA_COPY).read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == [METADATA, METADATA_COPY]


def test_finished_steps_are_those_with_dcps_metadata(tmp_path: Path) -> None:
    for step, generation, finished in [(20, 0, True), (40, 0, False), (30, 1, True)]:
        directory = tmp_path / step_directory(step, generation)
        directory.mkdir()
        if finished:
            (directory / METADATA).write_bytes(b"m")
    (tmp_path / "step-x").mkdir()
    assert finished_steps(tmp_path) == [(20, 0), (30, 1)]
    assert finished_steps(tmp_path / "absent") == []
    assert parse_step_directory("step-00000040-g2") == (40, 2)
    assert parse_step_directory("step-40-g2") is None


def run_ranks(world: int, mode: str, directory: Path) -> list[dict[str, object]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "SHOAL_CHECKPOINT_DIR": str(directory),
            "OMP_NUM_THREADS": "1",
            "TORCH_CPP_LOG_LEVEL": "ERROR",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, WORKER, mode],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    lines = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-3000:]
            lines.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    return sorted(lines, key=lambda line: int(str(line["rank"])))


@pytest.mark.timeout(600)
def test_a_state_saved_by_six_ranks_is_restored_resharded_by_four(tmp_path: Path) -> None:
    saved = run_ranks(6, "save", tmp_path)
    assert [line["failure"] for line in saved] == [None] * 6
    assert finished_steps(tmp_path) == [(20, 0), (40, 0)]
    restored = run_ranks(4, "restore", tmp_path)
    assert [line["step"] for line in restored] == [40] * 4
    assert all(line["shard_matches"] for line in restored), restored
    assert all(line["replicated"] == [40.0] * 5 for line in restored)


def one_rank(generation: int = 0) -> RankPlace:
    return RankPlace(rank=0, local_rank=0, world_size=1, local_world_size=1, generation=generation)


SINGLE = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
"""DCP warns when it saves in one process without torch.distributed, as these tests do."""


@SINGLE
def test_a_failed_background_write_is_raised_by_the_next_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"not a directory")
    monkeypatch.setenv("SHOAL_CHECKPOINT_DIR", str(blocked))
    checkpointer = Checkpointer(one_rank(), None)
    state = {"w": torch.ones(3)}
    checkpointer.save(state, 1)
    with pytest.raises(CheckpointError, match="step 1: writing"):
        checkpointer.save(state, 2)
    assert checkpointer.failure() is None, "taken once"
    checkpointer.close()
    checkpointer.close()
    with pytest.raises(CheckpointError, match="closed"):
        checkpointer.save(state, 3)


@pytest.mark.timeout(600)
def test_when_one_node_cannot_have_the_newest_step_every_rank_loads_the_older_one(
    tmp_path: Path,
) -> None:
    # the second between a commit and its copies: a node whose files' only holder died
    saved = run_ranks(2, "save", tmp_path)
    assert [line["failure"] for line in saved] == [None, None]
    for line in run_ranks(2, "fallback", tmp_path):
        assert line["step"] == 20, line  # rank 0 could have step 40 here, but rank 1 not
        assert line["shard_matches"] is True
        assert line["replicated"] == [20.0] * 5


def test_the_candidates_are_the_committed_step_then_older_kept_ones() -> None:
    answer = {
        "committed": {"step": 40, "generation": 2},
        "steps": [
            {"step": 20, "generation": 1},
            {"step": 30, "generation": 2},
            {"step": 40, "generation": 2},
        ],
    }
    assert committed_candidates(answer) == [(40, 2, True), (30, 2, True), (20, 1, True)]
    assert committed_candidates({"committed": None, "steps": []}) == []


@SINGLE
def test_without_a_daemon_restore_takes_the_newest_finished_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOAL_CHECKPOINT_DIR", str(tmp_path))
    unreachable = DaemonClient(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    checkpointer = Checkpointer(one_rank(), unreachable)
    assert checkpointer.restore({"w": torch.zeros(3)}) is None
    for step in (10, 20):
        checkpointer.save({"w": torch.full((3,), float(step))}, step)
    checkpointer.close()
    (tmp_path / step_directory(30, 0)).mkdir()  # begun, never finished
    state = {"w": torch.zeros(3)}
    again = Checkpointer(one_rank(), unreachable)
    assert again.restore(state) == 20
    assert state["w"].tolist() == [20.0] * 3
    again.save({"w": torch.zeros(3)}, 20)
    again.close()
    state = {"w": torch.zeros(3)}
    assert Checkpointer(one_rank(), unreachable).restore(state) == 20
    assert state["w"].tolist() == [20.0] * 3, "a step not above the restored one is skipped"


@SINGLE
@pytest.mark.timeout(180)
async def test_one_rank_saves_and_restores_through_its_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = test_settings(tmp_path, "solo", **FAST_ELECTION)
    monkeypatch.setenv("SHOAL_CHECKPOINT_DIR", str(settings.checkpoint_dir))
    async with NodeDaemon(settings) as daemon:
        client = DaemonClient(f"http://127.0.0.1:{daemon.port}")

        def train() -> None:
            checkpointer = Checkpointer(one_rank(generation=4), client)
            checkpointer.save({"w": torch.full((3,), 7.0)}, 7)
            checkpointer.close()

        await asyncio.to_thread(train)

        async def committed() -> dict[str, object] | None:
            status, answer = await asyncio.to_thread(client.exchange, "GET", "/v1/checkpoints")
            return answer["committed"] if status == 200 else None

        for _ in range(100):
            found = await committed()
            if found is not None:
                break
            await asyncio.sleep(0.1)
        assert found is not None
        assert (found["step"], found["generation"], found["holders"]) == (7, 4, {"solo": ["solo"]})

        def resume() -> tuple[int | None, list[float]]:
            state = {"w": torch.zeros(3)}
            step = Checkpointer(one_rank(generation=5), client).restore(state)
            return step, state["w"].tolist()

        assert await asyncio.to_thread(resume) == (7, [7.0] * 3)
        for _ in range(100):
            status, answer = await asyncio.to_thread(client.exchange, "GET", "/v1/checkpoints")
            last = answer["nodes"]["solo"]["last_restore"] if status == 200 else None
            if last is not None:
                break
            await asyncio.sleep(0.1)
        assert last is not None
        assert (last["step"], last["from"]) == (7, "local")
        client.close()
