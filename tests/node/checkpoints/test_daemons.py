"""Checkpoints across three real daemons on loopback (every one a voter): a step commits only
once every rank reported it, each node's files end up on the two others, a restore finds its
files here or fetches them from their holders (a wiped node, a corrupted copy, a holder that
dies mid-copy), a commit survives a coordinator failover between report and commit, and
retention deletes what no rank finished."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from aiohttp import ClientSession

from shoal._checkpoint_files import METADATA, file_digest, step_directory
from tests.node.checkpoints.cluster import NAMES, PIECE, Cluster, eventually

pytestmark = pytest.mark.timeout(240)

RANKS = {0: "c1", 1: "c1", 2: "c2", 3: "c2", 4: "c3", 5: "c3"}
BIG = 20 << 20
"""Rank 0's file: two sync pieces, so a copy goes through the swarm of piece holders."""
SMALL = 64 << 10


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(ClientSession())
        yield Cluster(tmp_path, stack, session)


SAME = {3: b"an empty shard", 5: b"an empty shard"}
"""Ranks whose files have the same content (as ranks holding no item write alike files)."""


async def write_step(cluster: Cluster, step: int, generation: int, ranks: dict[int, str]) -> None:
    for rank, node in sorted(ranks.items()):
        size = BIG if rank == 0 else SMALL
        status, answer = await cluster.write_rank(
            node, step, generation, rank, len(RANKS), size, content=SAME.get(rank)
        )
        assert status == 202, answer


def held_by_two_others(committed: dict[str, object]) -> bool:
    holders = committed["holders"]
    assert isinstance(holders, dict)
    return set(holders) == set(NAMES) and all(
        len(set(nodes) - {owner}) >= 2 for owner, nodes in holders.items()
    )


def sha(path: Path) -> str:
    return file_digest(path).hash


async def test_a_step_commits_once_every_rank_reported_and_every_node_holds_it(
    cluster: Cluster,
) -> None:
    await cluster.start()
    last = 5
    await write_step(cluster, 20, 1, {r: n for r, n in RANKS.items() if r != last})
    await asyncio.sleep(1.5)  # three loop rounds: every report has reached the coordinator
    assert (await cluster.checkpoints())["committed"] is None, "5 of 6 ranks commit nothing"
    await write_step(cluster, 20, 1, {last: RANKS[last]})
    committed = await eventually(lambda: cluster.committed(20, "c2"), 30, "step 20 committed")
    assert committed["generation"] == 1
    assert committed["world_size"] == 6
    sizes = BIG + 3 * SMALL + sum(map(len, SAME.values())) + len(b"metadata of step 20")
    assert committed["bytes"] == sizes

    async def copied() -> dict[str, object] | None:
        found = await cluster.committed(20, "c3")
        return found if found is not None and held_by_two_others(found) else None

    committed = await eventually(copied, 60, "every node's files held by two others")
    directory = step_directory(20, 1)
    originals = {
        f"__{rank}_0.distcp": sha(cluster.root(node) / directory / f"__{rank}_0.distcp")
        for rank, node in RANKS.items()
    }
    for name in NAMES:
        for file_name, digest in originals.items():
            assert sha(cluster.root(name) / directory / file_name) == digest, (name, file_name)

    taken = await cluster.write_rank("c1", 40, 1, 0, 6, SMALL)  # a file to report wrongly
    assert taken[0] == 202
    body = {"step": 40, "generation": 1, "rank": 1, "world_size": 6, "piece_size": PIECE}
    wrong = {**body, "directory": step_directory(40, 2), "files": []}
    status, answer = await cluster.call("c1", "POST", "/v1/checkpoints/written", wrong)
    assert (status, answer["error"]) == (409, "wrong_directory")
    digest = file_digest(cluster.root("c1") / step_directory(40, 1) / "__0_0.distcp")
    changed = {
        "name": "__0_0.distcp",
        "size": digest.size + 1,
        "mtime_ns": digest.mtime_ns,
        "hash": digest.hash,
        "pieces": [],
    }
    files = {**body, "directory": step_directory(40, 1), "files": [changed]}
    status, answer = await cluster.call("c1", "POST", "/v1/checkpoints/written", files)
    assert (status, answer["error"]) == (409, "file_changed")
    status, plan = await cluster.prepare("c2", {"step": 20, "generation": 1})
    assert status == 200, plan
    assert (plan["from"], plan["fetched_bytes"]) == ("local", 0)
    assert Path(plan["directory"]) == cluster.root("c2") / directory
    assert (Path(plan["directory"]) / METADATA).read_bytes() == b"metadata of step 20"


async def test_a_restore_fetches_a_wiped_or_corrupted_copy_from_its_holders(
    cluster: Cluster,
) -> None:
    await cluster.start()
    await write_step(cluster, 20, 1, RANKS)

    async def copied() -> bool:
        found = await cluster.committed(20)
        return found is not None and held_by_two_others(found)

    await eventually(copied, 90, "every node's files held by two others")
    directory = step_directory(20, 1)
    big = cluster.root("c3") / directory / "__0_0.distcp"
    digest = sha(big)
    with big.open("r+b") as handle:  # same size, one byte flipped
        handle.seek(BIG // 2)
        byte = handle.read(1)
        handle.seek(BIG // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    body = {"step": 20, "generation": 1}
    status, plan = await cluster.prepare("c3", body)
    assert status == 200, plan
    assert (plan["from"], plan["fetched_bytes"]) == ("peers", BIG)
    assert sha(big) == digest

    wiped = cluster.root("c2")
    for path in sorted(wiped.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    status, plan = await cluster.prepare("c2", body)
    assert status == 200, plan
    assert plan["from"] == "peers"
    assert plan["fetched_bytes"] == plan["bytes"]
    assert sha(wiped / directory / "__0_0.distcp") == digest
    assert (wiped / directory / METADATA).read_bytes() == b"metadata of step 20"
    status, recorded = await cluster.call(
        "c2", "POST", "/v1/checkpoints/restored", {"step": 20, "rank": 2, "seconds": 0.5}
    )
    assert status == 200, recorded

    async def recorded_restore() -> dict[str, object] | None:
        nodes = (await cluster.checkpoints("c1")).get("nodes", {})
        last = nodes.get("c2", {}).get("last_restore")
        return last if last and last["step"] == 20 else None

    last = await eventually(recorded_restore, 30, "c2's restore recorded")
    assert last["from"] == "peers"
    assert last["bytes"] == plan["bytes"]


async def test_a_holder_that_dies_mid_copy_is_replaced_by_another(cluster: Cluster) -> None:
    slow = {"sync_upload_limit_bytes_s": float(4 << 20)}
    await cluster.start({"c1": slow, "c2": slow})
    await write_step(cluster, 20, 1, RANKS)

    async def copied() -> bool:
        found = await cluster.committed(20)
        return found is not None and held_by_two_others(found)

    await eventually(copied, 120, "every node's files held by two others")
    directory = cluster.root("c3") / step_directory(20, 1)
    digest = sha(directory / "__0_0.distcp")
    for path in directory.iterdir():
        path.unlink()
    survivor = next(name for name in ("c1", "c2") if name != cluster.coordinator())
    victim = "c2" if survivor == "c1" else "c1"
    body = {"step": 20, "generation": 1}
    preparing = asyncio.create_task(cluster.prepare("c3", body))
    await asyncio.sleep(1.0)  # a few MiB of the big file came from both holders
    assert not preparing.done()
    await cluster.daemons[victim].close()
    status, plan = await preparing
    assert status == 200, plan
    assert plan["from"] == "peers"
    assert sha(directory / "__0_0.distcp") == digest


async def test_a_commit_survives_a_coordinator_failover_between_report_and_commit(
    cluster: Cluster,
) -> None:
    await cluster.start()
    old = cluster.coordinator()
    assert old is not None
    trainers = [name for name in NAMES if name != old]
    ranks = {0: trainers[0], 1: trainers[0], 2: trainers[1], 3: trainers[1]}
    for rank in (0, 1, 2):
        status, answer = await cluster.write_rank(ranks[rank], 20, 3, rank, 4, SMALL)
        assert status == 202, answer
    office = cluster.service(old).office
    await eventually(
        lambda: asyncio.sleep(0, office.pending.get((3, 20)) == (0, 1, 2)),
        30,
        "the coordinator holding 3 of 4 reports",
    )
    await cluster.daemons[old].close()
    del cluster.daemons[old]
    await eventually(
        lambda: asyncio.sleep(0, cluster.coordinator() not in (None, old)), 60, "a new coordinator"
    )
    status, answer = await cluster.write_rank(ranks[3], 20, 3, 3, 4, SMALL)
    assert status == 202, answer
    committed = await eventually(
        lambda: cluster.committed(20, trainers[0]), 60, "step 20 committed by the new coordinator"
    )
    assert committed["generation"] == 3
    assert set(committed["holders"]) == set(trainers)


async def test_steps_no_rank_finished_and_steps_beyond_the_kept_ones_are_deleted(
    cluster: Cluster,
) -> None:
    await cluster.start({name: {"checkpoint_keep": 2} for name in NAMES})
    await write_step(cluster, 10, 1, {0: "c1", 1: "c1"})  # 2 of 6 ranks: never committed
    for step in (20, 30, 40):
        await write_step(cluster, step, 1, RANKS)
        await eventually(lambda s=step: cluster.committed(s), 60, f"step {step} committed")

    def kept(name: str) -> set[str]:
        return {p.name for p in cluster.root(name).iterdir() if p.name.startswith("step-")}

    wanted = {step_directory(30, 1), step_directory(40, 1)}
    for name in NAMES:
        await eventually(
            lambda n=name: asyncio.sleep(0, kept(n) == wanted), 30, f"{name} keeping {wanted}"
        )
    steps = [s["step"] for s in (await cluster.checkpoints())["steps"]]
    assert steps == [30, 40]


def test_the_test_ranks_hash_as_the_daemon_does(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert sha(path) == hashlib.sha256(b"x" * 100).hexdigest()
