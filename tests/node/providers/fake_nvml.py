"""A fake NVML: a `pynvml` module written into a directory put first on the import path (of
this process or of a daemon's child process), whose GPUs and utilisation come from a JSON
file the test rewrites: `{"util": [0, 83]}`, or `{"fail": "why"}` for a driver that fails.

It is also the seam that fixes what a test's node sees on any host: `install_fake_nvml` then
`set()` gives an in-process daemon no GPU (`FakeGpus.child_env`: a daemon child process), so a
test about a GPU-less node passes on a GPU host too; `set(0.0)` gives it one GPU on CI's CPUs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV = "SHOAL_FAKE_NVML"

SOURCE = '''"""Fake pynvml for shoal's tests (see tests/node/providers/fake_nvml.py)."""
import json
import os

NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_DRIVER_NOT_LOADED = 9


class NVMLError(Exception):
    def __init__(self, value=999, text="fake NVML error"):
        super().__init__(text)
        self.value = value


class _Rates:
    def __init__(self, gpu):
        self.gpu = gpu
        self.memory = 0


class _Memory:
    used = 1024 * 1024 * 1024
    total = 16 * 1024 * 1024 * 1024
    free = total - used


def _state():
    with open(os.environ["SHOAL_FAKE_NVML"]) as file:
        state = json.load(file)
    if state.get("fail"):
        raise NVMLError(text=state["fail"])
    return state


def nvmlInit():
    return None


def nvmlShutdown():
    return None


def nvmlDeviceGetCount():
    return len(_state()["util"])


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetName(handle):
    return "Fake GPU"


def nvmlDeviceGetUUID(handle):
    return f"GPU-fake-{handle}"


def nvmlDeviceGetUtilizationRates(handle):
    util = _state()["util"][handle]
    if util is None:
        raise NVMLError(text="utilisation not readable")
    return _Rates(util)


def nvmlDeviceGetMemoryInfo(handle):
    return _Memory()


def __getattr__(name):
    if name.startswith("nvml"):
        def unsupported(*args):
            raise NVMLError(3, f"{name}: not supported by the fake")
        return unsupported
    raise AttributeError(name)
'''


@dataclass
class FakeGpus:
    """The state file of the fake NVML; `directory` holds its pynvml.py."""

    path: Path
    directory: Path

    def set(self, *util: float | None) -> None:
        """One GPU per value, at that utilisation (None: unreadable); none at all when empty."""
        self._write({"util": list(util)})

    def fail(self, why: str) -> None:
        self._write({"fail": why})

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` for a child process that must import this fake pynvml, not the host's."""
        return {**env, **self.overrides(env)}

    def overrides(self, env: Mapping[str, str]) -> dict[str, str]:
        """The variables `child_env` changes: the state file, the fake first on PYTHONPATH."""
        path = env.get("PYTHONPATH")
        search = f"{self.directory}{os.pathsep}{path}" if path else str(self.directory)
        return {ENV: str(self.path), "PYTHONPATH": search}

    def _write(self, state: dict[str, object]) -> None:
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps(state))
        os.replace(temp, self.path)


def write_fake_nvml(directory: Path, *util: float | None) -> FakeGpus:
    """Write the fake pynvml and its state file (GPUs at `util`) into `directory`, a new folder;
    nothing of this process changes (see `FakeGpus.child_env`, `install_fake_nvml`)."""
    directory.mkdir()
    (directory / "pynvml.py").write_text(SOURCE)
    gpus = FakeGpus(directory / "nvml.json", directory)
    gpus.set(*util)
    return gpus


def install_fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpus:
    """Shadow pynvml in this process and in child processes (PYTHONPATH); two idle GPUs."""
    gpus = write_fake_nvml(tmp_path / "fake_nvml", 0.0, 1.0)
    for name, value in gpus.overrides(os.environ).items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("pynvml", gpus.directory / "pynvml.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return gpus
