"""GPU faults: the rule that says which reads are faults (table-driven), the Xid table, the
JSON fake-GPU seam re-read at every read, NVML's fault sources through a fake NVML, and the
self-test (fake seam, DCGM, the matmul child)."""

from __future__ import annotations

import os
import stat
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from health import (
    ENV_FAKE_GPUS,
    XID_TABLE,
    FakeGpu,
    FaultKind,
    FaultSample,
    GpuFault,
    GpuReader,
    RecoveryAction,
    XidAction,
    judge,
    run_selftest,
    short_gpu_id,
    write_fake_gpus,
    xid_action,
)
from tests.health.test_gpu import FakeGpu as NvmlGpu
from tests.health.test_gpu import FakeNvml, NVMLError

UUID = "GPU-5d8f0e1c-2a"


def _sample(**fields: Any) -> FaultSample:
    return FaultSample(index=0, uuid=UUID, **fields)


JUDGED: list[tuple[str, FaultSample, FaultSample | None, list[str], int]] = [
    ("healthy", _sample(), None, [], 0),
    ("Xid 79", _sample(xids=(79,)), None, ["gpu_fault: Xid 79 on GPU-5d8f0e1c-2a"], 0),
    ("Xid 48", _sample(xids=(48,)), None, [f"gpu_fault: Xid 48 on {UUID}"], 0),
    ("Xid 94 (the issue's list)", _sample(xids=(94,)), None, [f"gpu_fault: Xid 94 on {UUID}"], 0),
    ("Xid 13 is the application's", _sample(xids=(13,)), None, [], 1),
    ("Xid 31, 43, 45 too", _sample(xids=(31, 43, 45)), None, [], 3),
    ("an Xid the table lacks", _sample(xids=(999,)), None, [], 1),
    (
        "a repeated Xid counts once",
        _sample(xids=(79, 79)),
        None,
        [f"gpu_fault: Xid 79 on {UUID}"],
        0,
    ),
    (
        "the driver's recovery action",
        _sample(recovery=RecoveryAction.GPU_RESET),
        None,
        [f"gpu_fault: recovery action gpu_reset on {UUID}"],
        0,
    ),
    (
        "the driver says none: Xid 94 is no fault",
        _sample(xids=(94,), recovery=RecoveryAction.NONE),
        None,
        [],
        1,
    ),
    (
        "the driver's action beats the table",
        _sample(xids=(48,), recovery=RecoveryAction.NODE_REBOOT),
        None,
        [f"gpu_fault: recovery action node_reboot on {UUID}"],
        1,
    ),
    (
        "row remapping failed",
        _sample(remap_failed=True),
        None,
        [f"gpu_fault: row remapping failed on {UUID}"],
        0,
    ),
    ("ECC count first read", _sample(ecc_uncorrected=5), None, [], 0),
    ("ECC count steady", _sample(ecc_uncorrected=5), _sample(ecc_uncorrected=5), [], 0),
    (
        "ECC count rising",
        _sample(ecc_uncorrected=6),
        _sample(ecc_uncorrected=5),
        [f"gpu_fault: uncorrected ECC errors rose 5 -> 6 on {UUID}"],
        0,
    ),
    ("ECC count not readable", _sample(), _sample(ecc_uncorrected=5), [], 0),
    (
        "unreadable",
        FaultSample(index=3, uuid="", unreadable="NVML: GPU is lost"),
        None,
        ["gpu_fault: unreadable (NVML: GPU is lost) on GPU index 3"],
        0,
    ),
    (
        "several at once, the unreadable first",
        _sample(xids=(79,), unreadable="gone"),
        None,
        [f"gpu_fault: unreadable (gone) on {UUID}"],
        0,
    ),
    (
        "several at once",
        _sample(xids=(79, 13), remap_failed=True),
        None,
        [f"gpu_fault: Xid 79 on {UUID}", f"gpu_fault: row remapping failed on {UUID}"],
        1,
    ),
]


@pytest.mark.parametrize(
    ("sample", "previous", "reasons", "ignored"),
    [case[1:] for case in JUDGED],
    ids=[case[0] for case in JUDGED],
)
def test_which_reads_are_faults(
    sample: FaultSample, previous: FaultSample | None, reasons: list[str], ignored: int
) -> None:
    verdict = judge(sample, previous)
    assert [fault.reason for fault in verdict.faults] == reasons
    assert len(verdict.ignored) == ignored


def test_the_xid_table_quarantines_the_hardware_classes_and_never_the_applications() -> None:
    for code in (48, 63, 64, 74, 79, 92, 94, 95, 119, 120):  # issue 32's list
        assert xid_action(code) is XidAction.QUARANTINE, code
    for code in (13, 31, 43, 45):
        assert xid_action(code) is XidAction.APPLICATION, code
    assert xid_action(999) is None
    assert all(code == entry.code and entry.name for code, entry in XID_TABLE.items())
    fault = GpuFault("GPU-5D8F0E1C-2A3B-4C5D-6E7F-0123456789AB", FaultKind.XID, "Xid 79")
    assert fault.reason == "gpu_fault: Xid 79 on GPU-5d8f0e1c-2a"
    assert short_gpu_id("GPU-not-a-uuid") == "GPU-not-a-uuid"


def test_the_json_seam_is_read_again_at_every_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gpus.json"
    write_fake_gpus(path, [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    monkeypatch.setenv(ENV_FAKE_GPUS, str(path))
    reader = GpuReader()
    try:
        assert [gpu.uuid for gpu in reader.read()] == ["GPU-a", "GPU-b"]
        assert [judge(s).faults for s in reader.read_faults([0, 1])] == [(), ()]
        write_fake_gpus(
            path,
            [FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", xids=(79,), selftest="fail")],
        )
        gpus = reader.read()
        assert (gpus[1].last_xid, gpus[1].error, gpus[0].error) == (79, True, False)
        [first, second] = reader.read_faults([0, 1])
        assert (first.xids, second.xids, second.selftest) == ((), (79,), "fail")
        assert [f.reason for f in judge(second).faults] == ["gpu_fault: Xid 79 on GPU-b"]
        write_fake_gpus(path, [FakeGpu(uuid="GPU-a", ecc_uncorrected=2)])
        assert reader.read()[0].ecc_uncorrected == 2
        [first, gone] = reader.read_faults([0, 1])
        assert first.ecc_uncorrected == 2
        assert gone.unreadable == f"{ENV_FAKE_GPUS} lists 1 GPUs"
        path.write_text('{"gpus": [{"uuid": "GPU-a", "xid": [79]}]}')
        [broken] = reader.read_faults([0])
        assert broken.unreadable is not None
        assert str(path) in broken.unreadable
    finally:
        reader.close()


@dataclass
class FaultNvml(FakeNvml):
    """FakeNvml with the driver's recovery action per GPU (None: not supported)."""

    recovery: dict[int, int] | None = None

    def nvmlDeviceGetFieldValues(self, handle: int, fields: list[int]) -> list[Any]:
        assert fields == [230]
        if self.recovery is None:
            raise NVMLError("Not Supported")
        value = types.SimpleNamespace(uiVal=self.recovery.get(handle, 0))
        return [types.SimpleNamespace(nvmlReturn=0, value=value)]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FaultNvml:
    fake = FaultNvml(gpus=[NvmlGpu(), NvmlGpu()])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    monkeypatch.delenv(ENV_FAKE_GPUS, raising=False)
    return fake


def test_nvml_fault_sources_flow_through_the_same_rule(nvml: FaultNvml) -> None:
    reader = GpuReader()
    try:
        first = reader.read_faults([0, 1])
        assert [(s.uuid, s.xids, s.ecc_uncorrected, s.recovery) for s in first] == [
            ("GPU-0000", (), 0, None),
            ("GPU-0001", (), 0, None),
        ]
        nvml.xids = [(1, 79), (1, 13)]
        reader.read()  # the status read drains the events too: read_faults still sees them
        nvml.gpus[0].ecc = 3
        nvml.gpus[0].remap_failed = 1
        second = reader.read_faults([0, 1])
        assert second[1].xids == (79, 13)
        reasons = [f.reason for s, p in zip(second, first, strict=True) for f in judge(s, p).faults]
        assert reasons == [
            "gpu_fault: row remapping failed on GPU-0000",
            "gpu_fault: uncorrected ECC errors rose 0 -> 3 on GPU-0000",
            "gpu_fault: Xid 79 on GPU-0001",
        ]
        assert reader.read_faults([1])[0].xids == ()  # each event once
        nvml.recovery = {1: 1}
        assert reader.read_faults([1])[0].recovery is RecoveryAction.GPU_RESET
        nvml.gpus[1].lost = True
        [lost, beyond] = reader.read_faults([1, 5])
        assert lost.unreadable is not None
        assert "GPU is lost" in lost.unreadable
        assert beyond.unreadable == "NVML sees 2 GPUs, not GPU 5"
    finally:
        reader.close()


def test_a_gpu_nvml_calls_lost_mid_read_is_unreadable(nvml: FaultNvml) -> None:
    class Lost(NVMLError):
        value = 15

    def lost(handle: int, kind: int, counter: int) -> int:
        raise Lost("GPU is lost")

    module = sys.modules["pynvml"]
    module.nvmlDeviceGetTotalEccErrors = lost  # type: ignore[attr-defined]
    reader = GpuReader()
    try:
        [sample] = reader.read_faults([0])
        assert (sample.uuid, sample.unreadable) == ("GPU-0000", "NVML: GPU is lost")
    finally:
        reader.close()


# the self-test


async def test_the_fake_seam_decides_the_self_test() -> None:
    passing = [_sample(selftest="pass"), FaultSample(index=1, uuid="GPU-b", selftest="pass")]
    result = await run_selftest(passing, 5.0)
    assert (result.passed, result.method) == (True, "fake")
    failing = [passing[0], FaultSample(index=1, uuid="GPU-b", selftest="fail")]
    result = await run_selftest(failing, 5.0)
    assert (result.passed, result.method, result.detail) == (False, "fake", "failed: GPU-b")
    result = await run_selftest([_sample(unreadable="NVML: GPU is lost")], 5.0)
    assert (result.passed, result.method) == (False, "nvml")
    assert "unreadable: NVML: GPU is lost" in result.detail
    assert not (await run_selftest([], 5.0)).passed


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_dcgm_decides_where_it_is_installed(tmp_path: Path) -> None:
    args = tmp_path / "args"
    ok = _script(tmp_path / "dcgmi-ok", f'echo "$@" > {args}; echo Pass')
    samples = [_sample(), FaultSample(index=2, uuid="GPU-c")]
    result = await run_selftest(samples, 5.0, dcgmi=ok)
    assert (result.passed, result.method) == (True, "dcgmi")
    assert args.read_text().split() == ["diag", "-r", "1", "-i", "0,2"]
    bad = _script(tmp_path / "dcgmi-bad", "echo 'Memory: Fail'; exit 226")
    result = await run_selftest(samples, 5.0, dcgmi=bad)
    assert (result.passed, result.detail) == (False, "Memory: Fail")
    slow = _script(tmp_path / "dcgmi-slow", "sleep 30")
    result = await run_selftest(samples, 0.3, dcgmi=slow)
    assert (result.passed, result.detail) == (False, "dcgmi-slow did not end within 0.3 s")
    assert result.duration_s < 10


async def test_without_dcgm_a_matmul_child_checks_each_gpu(tmp_path: Path) -> None:
    """The child (MATMUL_SCRIPT) under stand-ins for torch: one that CUDA finds no GPU in fails
    the test and says so; without torch the matmul is skipped and NVML decides."""
    no_cuda = tmp_path / "no_cuda"
    no_cuda.mkdir()
    (no_cuda / "torch.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n"
    )
    env = {**os.environ, "PYTHONPATH": str(no_cuda)}
    result = await run_selftest([_sample()], 60.0, env=env)
    assert (result.passed, result.method) == (False, "matmul")
    assert "CUDA sees no GPU" in result.detail
    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "torch.py").write_text("raise ImportError('no torch here')\n")
    env = {**os.environ, "PYTHONPATH": str(missing)}
    result = await run_selftest([_sample()], 60.0, env=env)
    assert (result.passed, result.method) == (True, "nvml")
    assert "matmul skipped: torch is not installed (no torch here)" in result.detail


# the docs


PAGE = Path(__file__).resolve().parents[2] / "docs" / "fault-tolerance.md"


def xid_rows() -> str:
    """The Xid table of docs/fault-tolerance.md as health.xids makes it."""
    rows = ["| Xid | NVIDIA's name | shoal | what brings it back |", "|---|---|---|---|"]
    rows += [
        f"| {code} | {entry.name} | {entry.action.value} | {entry.resolution} |"
        for code, entry in sorted(XID_TABLE.items())
    ]
    return "\n".join(rows)


def test_the_docs_xid_table_is_the_code_table() -> None:
    text = PAGE.read_text(encoding="utf-8")
    shown = text.split("<!-- xids:begin -->\n", 1)[1].split("\n<!-- xids:end -->", 1)[0]
    assert shown == xid_rows(), f"docs/fault-tolerance.md's Xid table should be:\n{xid_rows()}"


def test_the_docs_settings_table_shows_the_defaults() -> None:
    from config import load_settings

    settings = load_settings(env={}, flags={}).settings
    text = PAGE.read_text(encoding="utf-8").split("### Settings", 1)[1]
    for key in ("gpu_fault_check_s", "gpu_readmit_settle_s", "gpu_quarantine_limit"):
        assert f"| `{key}` | {getattr(settings, key):g} |" in text, key
    for key in ("gpu_read_s", "gpu_selftest_s"):
        assert f"| `timeouts.{key}` | {getattr(settings.timeouts, key):g} |" in text, key
