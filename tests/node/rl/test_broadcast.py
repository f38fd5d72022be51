"""Bucketed weight broadcast between 3 real gloo processes, bucket planning, digests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node.errors import WeightsError
from node.rl.broadcast import plan_buckets

torch = pytest.importorskip("torch")

from node.rl.broadcast import broadcast_weights, describe_params  # noqa: E402
from node.rl.digest import SHA256_ALGO, weights_digest  # noqa: E402

WORKER = Path(__file__).with_name("broadcast_worker.py")
ROUNDS = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_three(bucket_bytes: int) -> list[dict[str, object]]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(port), str(ROUNDS), str(bucket_bytes)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(3)
    ]
    lines: list[dict[str, object]] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-2000:]
            lines += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return lines


def by_version(lines: list[dict[str, object]]) -> dict[int, dict[int, str]]:
    table: dict[int, dict[int, str]] = {}
    for line in lines:
        table.setdefault(int(str(line["version"])), {})[int(str(line["rank"]))] = str(line["sha"])
    return table


@pytest.fixture(scope="module")
def runs() -> dict[int, dict[int, dict[int, str]]]:
    """Rounds by bucket size: 300 bytes (several buckets, some tensors alone), 0 (per tensor)."""
    return {size: by_version(run_three(size)) for size in (300, 0)}


def test_every_receiver_equals_the_trainer_after_each_of_ten_broadcasts(
    runs: dict[int, dict[int, dict[int, str]]],
) -> None:
    table = runs[300]
    assert sorted(table) == list(range(1, ROUNDS + 1))
    for version, shas in table.items():
        assert sorted(shas) == [0, 1, 2], version
        assert shas[1] == shas[0], version
        assert shas[2] == shas[0], version
    assert len({shas[0] for shas in table.values()}) == ROUNDS  # the weights really changed


def test_bucketed_and_per_tensor_broadcasts_give_the_same_bytes(
    runs: dict[int, dict[int, dict[int, str]]],
) -> None:
    bucketed, per_tensor = runs[300], runs[0]
    assert bucketed == per_tensor
    assert all(len(set(shas.values())) == 1 for shas in per_tensor.values())


def test_buckets_hold_one_dtype_and_respect_the_size() -> None:
    sizes = [("f32", 100), ("f32", 100), ("f32", 100), ("f64", 50), ("f32", 500), ("f32", 10)]
    assert plan_buckets(sizes, 250) == [[0, 1], [2], [3], [4], [5]]
    assert plan_buckets(sizes, 0) == [[i] for i in range(6)]
    assert plan_buckets(sizes, 10_000) == [[0, 1, 2], [3], [4, 5]]
    assert plan_buckets([], 100) == []
    alone = [("f32", 10), ("f32", 10), ("f32", 60), ("f32", 10), ("f32", 10), ("f32", 10)]
    assert plan_buckets(alone, 1000, alone_bytes=50) == [[0, 1], [2], [3, 4, 5]]
    many_small = [("f32", 40)] * 5
    assert plan_buckets(many_small, 1000, alone_bytes=50) == [[0, 1, 2, 3, 4]]


def test_digest_and_description_follow_the_parameters() -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    before = weights_digest(net)
    assert weights_digest(net) == before
    with torch.no_grad():
        net.bias[0] += 1.0
    assert weights_digest(net) != before
    infos = [info.to_dict() for info in describe_params(net)]
    assert infos == [
        {"name": "weight", "shape": [2, 3], "dtype": "float32", "nbytes": 24},
        {"name": "bias", "shape": [2], "dtype": "float32", "nbytes": 8},
    ]


def test_a_negative_version_is_refused_before_any_collective() -> None:
    with pytest.raises(WeightsError, match="integer >= 0"):
        broadcast_weights(torch.nn.Linear(1, 1), object(), -1)


def test_the_digest_hashes_pieces_of_each_parameter_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hashlib

    import node.rl.digest as digest

    monkeypatch.setattr(digest, "DIGEST_CHUNK_BYTES", 64)
    model = torch.nn.Linear(10, 3)  # weight: 120 bytes in 2 pieces, bias: 12 bytes in 1
    expected = hashlib.sha256()
    for name, param in model.named_parameters():
        data = bytes(param.detach().contiguous().view(torch.uint8).reshape(-1).tolist())
        expected.update(f"{name}:{param.dtype}:{tuple(param.shape)};".encode())
        for at in range(0, len(data), 64):
            expected.update(hashlib.sha256(data[at : at + 64]).digest())
    assert weights_digest(model, SHA256_ALGO).value == expected.hexdigest()
    with torch.no_grad():
        model.weight[-1, -1] += 1.0  # a byte of the last piece of the weight
    assert weights_digest(model, SHA256_ALGO).value != expected.hexdigest()
