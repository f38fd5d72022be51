"""The `gpu` marker: such tests skip, naming CUDA, where CUDA is unusable or torch is absent;
torch is imported only when a `gpu`-marked test is collected."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import cuda_missing

ROOT = Path(__file__).resolve().parents[1]
GPU_TEST = "tests/node/test_groups.py::test_nccl_rendezvous_with_cuda_forms_an_nccl_group"


def _torch_cuda() -> object:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
        import torch

    return torch.cuda


def test_without_torch_cuda_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    reason = cuda_missing()
    assert reason is not None
    assert reason.startswith("needs CUDA: torch is not installed")


def test_cuda_is_missing_exactly_when_torch_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _torch_cuda()
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    assert cuda_missing() == "needs CUDA: torch.cuda.is_available() is false on this host"
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    assert cuda_missing() is None


def _pytest_in_child(*args: str, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """Run pytest with `args` in a child; its output, and whether it had imported torch."""
    code = (
        "import sys, pytest\n"
        f"pytest.main({['-p', 'no:cacheprovider', *args]!r})\n"
        "print('torch loaded:', 'torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, "torch loaded: True" in result.stdout


def test_collecting_no_gpu_test_never_imports_torch() -> None:
    output, torch_loaded = _pytest_in_child("--collect-only", "-q", "tests/test_skips.py")
    assert "2 tests collected" in output
    assert not torch_loaded


def test_a_gpu_test_skips_naming_cuda_where_no_device_is_visible() -> None:
    output, torch_loaded = _pytest_in_child("-q", "-rs", GPU_TEST, env={"CUDA_VISIBLE_DEVICES": ""})
    assert "1 skipped" in output, output
    assert "needs CUDA: torch.cuda.is_available() is false on this host" in output
    assert torch_loaded
