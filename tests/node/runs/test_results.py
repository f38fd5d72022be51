"""The local results store: a file appears at its key only complete and matching its hash."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from net import MockTransport, PeerClient
from net.transport import PeerResponse
from node.errors import ResultsStoreError
from node.runs.results import FetchJson, LocalResults, NodeResults, result_key


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_a_verified_file_lands_at_its_key(tmp_path: Path) -> None:
    store = LocalResults(tmp_path)
    key = result_key("run-1", "n1", "ckpt/model.pt")
    assert key == "runs/run-1/n1/ckpt/model.pt"
    digest = hashlib.sha256(b"abcdef").hexdigest()
    stored = await store.put(key, chunks(b"abc", b"def"), digest)
    assert stored["hash"] == digest
    assert (tmp_path / key).read_bytes() == b"abcdef"


async def test_a_file_that_does_not_match_its_hash_never_appears(tmp_path: Path) -> None:
    store = LocalResults(tmp_path)
    key = result_key("run-1", "n1", "out.txt")
    with pytest.raises(ResultsStoreError) as caught:
        await store.put(key, chunks(b"torn"), hashlib.sha256(b"whole").hexdigest())
    assert caught.value.code == "result_hash_mismatch"
    assert not (tmp_path / key).exists()
    assert list((tmp_path / ".incoming").iterdir()) == []


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", ""])
def test_result_paths_stay_inside_the_run(path: str) -> None:
    with pytest.raises(ResultsStoreError):
        result_key("run-1", "n1", path)


def _results_node(answer: object) -> MockTransport:
    return MockTransport(lambda request: PeerResponse.of_json(answer))


FETCH = FetchJson(key="runs/r1/n1/out.txt", node="n1", job_id="j1", path="out.txt")


async def test_a_results_nodes_stored_record_is_read() -> None:
    stored = {"key": FETCH["key"], "size": 3, "hash": "abc", "store": "local"}
    async with PeerClient(transport=_results_node(stored)) as peers:
        answer = await NodeResults("r", 5.0).collect(peers, "http://127.0.0.1:1", FETCH)
    assert answer == stored


async def test_a_results_nodes_malformed_record_is_refused_naming_the_field() -> None:
    stored = {"key": FETCH["key"], "size": "three", "hash": "abc", "store": "local"}
    async with PeerClient(transport=_results_node(stored)) as peers:
        with pytest.raises(ResultsStoreError, match="cannot be read: size:"):
            await NodeResults("r", 5.0).collect(peers, "http://127.0.0.1:1", FETCH)
