"""Suite-wide pytest setup: the multi-host harness fixtures (tests/cluster/fixtures.py);
`gpu`-marked tests skipped, naming CUDA, where torch.cuda.is_available() is false or torch is
absent (torch is imported only when such a test is collected); and SIGINT handled as in a
terminal even when the suite was started with it ignored (`nohup`, a background job of a
script): the tests that press Ctrl-C on a CLI child would otherwise send it to a process that
inherited the ignoring."""

from __future__ import annotations

import signal
import warnings

import pytest

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = ["tests.cluster.fixtures"]


def cuda_missing() -> str | None:
    """Why CUDA cannot be used in this process, or None when it can."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
            import torch
    except ImportError as exc:
        return f"needs CUDA: torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return "needs CUDA: torch.cuda.is_available() is false on this host"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_tests:
        return
    reason = cuda_missing()
    if reason is not None:
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason=reason))
