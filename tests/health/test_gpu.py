"""GPU check: not applicable on this GPU-less host; GPU faults through a fake NVML at the seam."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field, fields
from typing import Any

import pytest

from health import (
    ENV_FAKE_GPUS,
    GpuInfo,
    GpuReader,
    HealthError,
    HealthStatus,
    fake_gpu_uuids,
    gpu_check,
    read_gpus,
)
from tests.health.conftest import FakeClock

MIB = 1024 * 1024


async def test_no_gpu_here_is_not_applicable() -> None:
    if read_gpus():
        pytest.skip("this host has an NVIDIA GPU; the not-applicable path needs one without")
    reader = GpuReader()
    try:
        gpus, reason = reader.read_with_reason()
        assert gpus == []
        assert reason
        result = await gpu_check(reader)()
        assert result.status is HealthStatus.NOT_APPLICABLE
        assert result.message == reason
    finally:
        reader.close()


async def test_missing_library_is_not_applicable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    result = await gpu_check(GpuReader())()
    assert result.status is HealthStatus.NOT_APPLICABLE
    assert "nvidia-ml-py is not installed" in result.message


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    util: int = 40
    used_mb: int = 1000
    total_mb: int = 81559
    temperature: int | None = 50
    ecc: int = 0
    remap_pending: int = 0
    remap_failed: int = 0
    power_mw: int | None = 312_500
    lost: bool = False


@dataclass
class FakeNvml:
    """The pynvml functions GpuReader calls, over a list of fake GPUs."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: str | None = None
    xids: list[tuple[int, int]] = field(default_factory=list)  # (gpu index, Xid code)
    shutdowns: int = 0

    def module(self) -> types.ModuleType:
        fake = types.ModuleType("pynvml")
        fake.NVMLError = NVMLError  # type: ignore[attr-defined]
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(fake, name, getattr(self, name))
        return fake

    def _gpu(self, handle: int) -> FakeGpu:
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError("GPU is lost")
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._gpu(index)
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self._gpu(handle).name.encode()

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle:04d}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        gpu = self._gpu(handle)
        return types.SimpleNamespace(used=gpu.used_mb * MIB, total=gpu.total_mb * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return types.SimpleNamespace(gpu=self._gpu(handle).util, memory=0)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        temperature = self._gpu(handle).temperature
        if temperature is None:
            raise NVMLError("Not Supported")
        return temperature

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)  # uncorrected, volatile
        return self._gpu(handle).ecc

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle)
        return (0, 0, gpu.remap_pending, gpu.remap_failed)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        power = self._gpu(handle).power_mw
        if power is None:
            raise NVMLError("Not Supported")
        return power

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, event_set: str) -> None:
        assert kinds == 0x8

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if not self.xids:
            raise NVMLError("Timeout")
        index, code = self.xids.pop(0)
        return types.SimpleNamespace(device=index, eventType=0x8, eventData=code)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu()])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    return fake


async def test_healthy_gpus(nvml: FakeNvml) -> None:
    reader = GpuReader()
    [first, _] = reader.read()
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.uuid == "GPU-0000"
    assert (first.util_pct, first.memory_used_mb, first.memory_total_mb) == (40.0, 1000, 81559)
    assert (first.temperature_c, first.ecc_uncorrected, first.xid_errors) == (50.0, 0, 0)
    assert (first.remapped_pending, first.remapped_failed, first.error) == (False, False, False)
    assert first.power_watts == 312.5
    result = await gpu_check(reader)()
    assert result.status is HealthStatus.HEALTHY
    assert result.message == "2 GPUs ok"
    assert result.metrics["gpus"] == 2
    assert result.metrics["gpu1_memory_used_mb"] == 1000
    assert result.metrics["gpu1_power_watts"] == 312.5
    reader.close()
    reader.close()
    assert nvml.shutdowns == 1
    with pytest.raises(HealthError, match="closed"):
        reader.read()


async def test_uncorrected_ecc_and_failed_remap_are_unhealthy(nvml: FakeNvml) -> None:
    nvml.gpus[1].ecc = 2
    nvml.gpus[1].remap_failed = 1
    reader = GpuReader()
    gpu = reader.read()[1]
    assert gpu.error
    assert gpu.problems == ("2 uncorrected ECC errors", "row remapping failed")
    result = await gpu_check(reader)()
    assert result.status is HealthStatus.UNHEALTHY
    assert result.message == "GPU 1: 2 uncorrected ECC errors; GPU 1: row remapping failed"


async def test_pending_remap_and_heat_are_degraded(nvml: FakeNvml) -> None:
    nvml.gpus[0].remap_pending = 1
    nvml.gpus[1].temperature = 88
    result = await gpu_check(GpuReader())()
    assert result.status is HealthStatus.DEGRADED
    assert "GPU 0: row remapping pending" in result.message
    assert "GPU 1: temperature 88 C" in result.message
    nvml.gpus[1].temperature = 97
    assert (await gpu_check(GpuReader())()).status is HealthStatus.UNHEALTHY


async def test_xid_errors_are_unhealthy_while_recent(nvml: FakeNvml, clock: FakeClock) -> None:
    reader = GpuReader(clock=clock)
    check = gpu_check(reader, xid_window_s=600.0)
    assert (await check()).status is HealthStatus.HEALTHY
    nvml.xids = [(1, 79)]
    result = await check()
    assert result.status is HealthStatus.UNHEALTHY
    assert "GPU 1: 1 Xid errors, last Xid 79 0 s ago" in result.message
    gpu = reader.read()[1]
    assert (gpu.xid_errors, gpu.last_xid, gpu.error) == (1, 79, True)
    clock.advance(601.0)
    result = await check()
    assert result.status is HealthStatus.HEALTHY
    assert "last Xid 79 601 s ago" in result.message


async def test_unsupported_readings_are_none(nvml: FakeNvml) -> None:
    nvml.gpus[0].temperature = None
    nvml.gpus[0].power_mw = None
    gpu = GpuReader().read()[0]
    assert gpu.temperature_c is None
    assert gpu.power_watts is None
    assert not gpu.error


async def test_lost_gpu_is_unhealthy(nvml: FakeNvml) -> None:
    reader = GpuReader()
    reader.read()
    nvml.gpus[0].lost = True
    gpu = reader.read()[0]
    assert gpu.error
    assert gpu.problems == ("cannot read GPU 0: GPU is lost",)
    assert (await gpu_check(reader)()).status is HealthStatus.UNHEALTHY


async def test_failing_driver_is_an_error(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = GpuReader()
    reader.read()

    def broken() -> int:
        raise NVMLError("Unknown Error")

    monkeypatch.setattr(sys.modules["pynvml"], "nvmlDeviceGetCount", broken)
    with pytest.raises(HealthError, match="cannot count GPUs: Unknown Error") as info:
        reader.read()
    assert isinstance(info.value.__cause__, NVMLError)


@pytest.mark.parametrize(
    ("gpus", "init_error", "reason"),
    [
        ([], None, "no NVIDIA GPU found"),
        ([FakeGpu()], "Driver Not Loaded", "no NVIDIA driver (Driver Not Loaded)"),
    ],
)
async def test_no_gpu_or_no_driver_is_not_applicable(
    monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], init_error: str | None, reason: str
) -> None:
    fake = FakeNvml(gpus=gpus, init_error=init_error)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    result = await gpu_check(GpuReader())()
    assert result.status is HealthStatus.NOT_APPLICABLE
    assert result.message == reason


async def test_what_a_node_reads_is_what_the_monitor_parses(
    nvml: FakeNvml, clock: FakeClock
) -> None:
    """One GpuInfo on both sides of /v1/status: every field survives to_json, JSON and
    from_json, so the monitor sees exactly what the node read."""
    nvml.gpus[1].ecc = 2
    nvml.gpus[0].temperature = None
    nvml.xids = [(1, 79)]
    reader = GpuReader(clock=clock)
    read = reader.read()
    reader.close()
    assert read[1].last_xid == 79
    assert read[1].problems
    wire = json.loads(json.dumps([gpu.to_json() for gpu in read]))
    assert [GpuInfo.from_json(entry, position) for position, entry in enumerate(wire)] == read
    assert wire[1]["problems"] == list(read[1].problems)
    assert set(wire[0]) == {field.name for field in fields(GpuInfo)}


def test_a_gpu_entry_of_the_wrong_shape_reads_as_unknowns() -> None:
    odd = {"index": "one", "name": 3, "util_pct": True, "ecc_uncorrected": True}
    odd |= {"problems": ["hot", 7], "error": 1}
    gpu = GpuInfo.from_json(odd, position=4)
    assert (gpu.index, gpu.name, gpu.uuid, gpu.util_pct) == (4, "?", "", None)
    assert (gpu.problems, gpu.error, gpu.last_xid) == (("hot",), True, None)
    assert gpu.ecc_uncorrected is None


def test_the_fake_gpu_seam_reports_its_uuids_instead_of_nvml(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FAKE_GPUS, "GPU-x, GPU-y")
    assert fake_gpu_uuids() == ("GPU-x", "GPU-y")
    reader = GpuReader()
    gpus, reason = reader.read_with_reason()
    assert [(gpu.index, gpu.uuid, gpu.error) for gpu in gpus] == [
        (0, "GPU-x", False),
        (1, "GPU-y", False),
    ]
    assert reason == ""
    assert GpuReader(fake_uuids=["GPU-z"]).read()[0].uuid == "GPU-z"
    monkeypatch.setenv(ENV_FAKE_GPUS, "")
    assert GpuReader().read_with_reason() == ([], f"{ENV_FAKE_GPUS} lists no GPU")
    monkeypatch.delenv(ENV_FAKE_GPUS)
    assert fake_gpu_uuids() is None
    assert [gpu.uuid for gpu in GpuReader().read()] == ["GPU-0000", "GPU-0001"]
