"""`submit(JobRequest)` over the job API of a real daemon: wait, status, failure, terminate."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from node.tasks import JobFailedError, JobRequest, ResourceConfig, TaskError, submit
from tests.node.jobs.client_daemon import ServedNode, served_node


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedNode]:
    with served_node(tmp_path_factory.mktemp("submit"), gpus=(0.0,)) as served:
        yield served


def test_submit_wait_and_failure(node: ServedNode) -> None:
    config = str(node.config_file)
    ok = submit(JobRequest("ok", [sys.executable, "-c", "print(1)"]), node.url, config)
    assert ok.wait(timeout_s=60) == "succeeded"
    assert ok.status() == "succeeded"
    bad = submit(
        JobRequest("bad", [sys.executable, "-c", "import sys; sys.exit(4)"], env={"A": "1"}),
        node.url,
        config,
    )
    with pytest.raises(JobFailedError, match="exit code 4"):
        bad.wait(timeout_s=60)
    assert bad.wait(timeout_s=60, raise_on_failure=False) == "failed"


def test_terminate_and_gpu_placement(node: ServedNode) -> None:
    """The node has exactly one GPU (the fake NVML's, on any host): a one-GPU job is placed on
    it and runs, a two-GPU job is refused before anything starts."""
    config = str(node.config_file)
    long = submit(
        JobRequest("long", [sys.executable, "-c", "import time; time.sleep(120)"]), node.url, config
    )
    assert long.status() in ("pending", "running")
    long.terminate()
    assert long.wait(timeout_s=60, raise_on_failure=False) == "killed"
    with pytest.raises(TaskError, match="no alive node of role 'any' has 2 GPUs"):
        submit(JobRequest("two-gpus", ["true"], ResourceConfig(gpus=2)), node.url, config)
    placed = submit(JobRequest("one-gpu", ["true"], ResourceConfig(gpus=1)), node.url, config)
    assert placed.wait(timeout_s=60) == "succeeded"
