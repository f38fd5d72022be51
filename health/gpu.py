"""GPU health through NVML (nvidia-ml-py, imported lazily): memory, load, temperature, ECC,
remapped rows, power and Xid events. No GPU, no driver or no library is "not applicable", never a
failure. GpuInfo is also the GPU of another node as cluster_monitor reads it from /v1/status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, TypeVar

from health.errors import HealthError
from health.fields import read_bool, read_float, read_int, read_list, read_str
from health.gpu_fake import ENV_FAKE_GPUS, FakeGpu, FakeGpus, fake_gpus_from_env, fake_sample
from health.gpu_faults import FaultSample, sample_nvml, unreadable_sample, with_xids
from health.status import CheckFn, CheckResult, HealthStatus

__all__ = ["ENV_FAKE_GPUS", "GpuInfo", "GpuReader", "fake_gpu_uuids", "gpu_check", "read_gpus"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

MIB = 1024 * 1024
MAX_EVENTS_PER_READ = 1000
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
_VOLATILE_ECC = 0  # NVML_VOLATILE_ECC: since the driver was loaded
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it; None where the GPU or driver does not support a reading.

    `error` is True when the GPU has a hardware fault (uncorrected ECC errors, failed row
    remapping, Xid errors, or it cannot be read); `problems` says which, in words.
    """

    index: int
    name: str
    uuid: str
    util_pct: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None
    temperature_c: float | None
    ecc_uncorrected: int | None
    remapped_pending: bool | None
    remapped_failed: bool | None
    xid_errors: int | None
    error: bool
    power_watts: float | None = None
    last_xid: int | None = None
    last_xid_age_s: float | None = None
    problems: tuple[str, ...] = ()

    @property
    def faults(self) -> tuple[str, ...]:
        """Short names of the hardware faults: ecc, remap, xid, error (unreadable or flagged)."""
        found = []
        if self.ecc_uncorrected:
            found.append("ecc")
        if self.remapped_pending or self.remapped_failed:
            found.append("remap")
        if self.xid_errors:
            found.append("xid")
        if self.error and not found:
            found.append("error")
        return tuple(found)

    def to_json(self) -> dict[str, Any]:
        """The entry of `gpus` in /v1/status (and the monitor's --json); from_json reads it."""
        data = asdict(self)
        data["problems"] = list(self.problems)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], position: int = 0) -> GpuInfo:
        """A GpuInfo from another node's to_json; fields missing or of the wrong type become
        None (the index becomes `position`, the name "?"), never an error."""
        index = read_int(data.get("index"))
        problems = read_list(data.get("problems"))
        return cls(
            index=position if index is None else index,
            name=read_str(data.get("name")) or "?",
            uuid=read_str(data.get("uuid")) or "",
            util_pct=read_float(data.get("util_pct")),
            memory_used_mb=read_float(data.get("memory_used_mb")),
            memory_total_mb=read_float(data.get("memory_total_mb")),
            temperature_c=read_float(data.get("temperature_c")),
            ecc_uncorrected=read_int(data.get("ecc_uncorrected")),
            remapped_pending=read_bool(data.get("remapped_pending")),
            remapped_failed=read_bool(data.get("remapped_failed")),
            xid_errors=read_int(data.get("xid_errors")),
            error=bool(data.get("error")),
            power_watts=read_float(data.get("power_watts")),
            last_xid=read_int(data.get("last_xid")),
            last_xid_age_s=read_float(data.get("last_xid_age_s")),
            problems=tuple(problem for problem in problems if isinstance(problem, str)),
        )


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuReader:
    """Owns this process's NVML session and its Xid event subscription.

    `read()` blocks on the driver: call it through `asyncio.to_thread`. Thread-safe.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        fake_uuids: Sequence[str] | None = None,
    ) -> None:
        """`fake_uuids` (a test seam, like ENV_FAKE_GPUS, which it overrides): report GPUs with
        these UUIDs and no readings instead of NVML's. ENV_FAKE_GPUS is looked at once, at the
        first read; a JSON file it names is read again at every read."""
        self._clock = clock
        self._fake = None if fake_uuids is None else FakeGpus(uuids=tuple(fake_uuids))
        self._fake_read = fake_uuids is not None
        self._lock = threading.Lock()
        self._nvml: ModuleType | None = None
        self._events: Any = None
        self._xids: dict[str, list[tuple[float, int]]] = {}  # uuid -> (seen at, Xid code)
        self._xids_judged: dict[str, int] = {}  # uuid -> how many of its Xids read_faults saw
        self._closed = False

    def read(self) -> list[GpuInfo]:
        """Every GPU of this host, or [] when there is none or no usable driver.

        Raises HealthError when the driver is loaded but fails, or the reader is closed.
        """
        return self.read_with_reason()[0]

    def read_with_reason(self) -> tuple[list[GpuInfo], str]:
        """The GPUs, and why the list is empty (or "" when it is not)."""
        with self._lock:
            fake = self._fake_source()
            if fake is not None:
                gpus = fake.read()
                infos = [_fake(index, gpu, fake.with_readings) for index, gpu in enumerate(gpus)]
                return infos, "" if gpus else f"{ENV_FAKE_GPUS} lists no GPU"
            nvml, count, reason = self._count()
            if nvml is None:
                return [], reason
            return [self._read_one(nvml, index) for index in range(count)], ""

    def read_faults(self, indices: Sequence[int]) -> list[FaultSample]:
        """The fault sources of the GPUs at NVML `indices` (health.gpu_faults judges them): the
        Xid events since the previous call, the ECC count, the row-remapping failure flag and
        the driver's recovery action. A GPU that is gone, or NVML that fails, is unreadable.
        Blocks on the driver: call it from a thread with a deadline. HealthError once closed."""
        with self._lock:
            fake = self._fake_source()
            if fake is not None:
                try:
                    gpus = fake.read()
                except HealthError as exc:
                    return [unreadable_sample(index, "", str(exc)) for index in indices]
                return [fake_sample(index, gpus) for index in indices]
            try:
                nvml, count, reason = self._count()
            except HealthError as exc:
                reason, nvml = str(exc), None
            if nvml is None:
                return [unreadable_sample(index, "", reason) for index in indices]
            return [self._sample_one(nvml, index, count) for index in indices]

    def _fake_source(self) -> FakeGpus | None:
        """The fake GPUs of the test seam, or None (NVML). HealthError once closed."""
        if self._closed:
            raise HealthError("GPU reader is closed")
        if not self._fake_read:
            self._fake, self._fake_read = fake_gpus_from_env(), True
        return self._fake

    def _count(self) -> tuple[ModuleType | None, int, str]:
        """NVML (None: not usable, and why), how many GPUs it sees, with new events drained."""
        if self._nvml is None:
            reason = self._init()
            if reason:
                return None, 0, reason
        nvml = self._nvml
        assert nvml is not None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise HealthError(f"NVML is loaded but cannot count GPUs: {exc}") from exc
        if count == 0:
            return None, 0, "no NVIDIA GPU found"
        self._drain_events(nvml)
        return nvml, count, ""

    def _sample_one(self, nvml: ModuleType, index: int, count: int) -> FaultSample:
        if index >= count:
            return unreadable_sample(index, "", f"NVML sees {count} GPUs, not GPU {index}")
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            return unreadable_sample(index, "", f"NVML: {exc}")
        seen = self._xids.get(uuid, [])
        new = tuple(code for _, code in seen[self._xids_judged.get(uuid, 0) :])
        self._xids_judged[uuid] = len(seen)
        return with_xids(sample_nvml(nvml, handle, index, uuid), new)

    def close(self) -> None:
        """End the NVML session. Idempotent and irreversible."""
        with self._lock:
            self._closed = True
            nvml, self._nvml = self._nvml, None
            if nvml is None:
                return
            try:
                if self._events is not None:
                    nvml.nvmlEventSetFree(self._events)
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                logger.debug("NVML shutdown failed: %s", exc)

    def _init(self) -> str:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            return f"nvidia-ml-py is not installed ({exc})"
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            return f"no NVIDIA driver ({exc})"
        self._nvml = nvml
        self._subscribe_xids(nvml)
        return ""

    def _subscribe_xids(self, nvml: ModuleType) -> None:
        try:
            self._events = nvml.nvmlEventSetCreate()
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            logger.debug("NVML event sets unsupported, Xid errors not readable: %s", exc)
            return
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL, self._events)
                self._xids[_text(nvml.nvmlDeviceGetUUID(handle))] = []
            except nvml.NVMLError as exc:
                logger.debug("GPU %d: Xid events not readable: %s", index, exc)

    def _drain_events(self, nvml: ModuleType) -> None:
        if self._events is None:
            return
        now = self._clock()
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                return  # NVML_ERROR_TIMEOUT: no more events
            if data.eventType & _XID_CRITICAL:
                self._xids.setdefault(uuid, []).append((now, int(data.eventData)))
                logger.warning("GPU %s reported Xid %d", uuid, int(data.eventData))

    def _read_one(self, nvml: ModuleType, index: int) -> GpuInfo:
        def attempt(fn: Callable[[], T]) -> T | None:
            try:
                return fn()
            except nvml.NVMLError:
                return None

        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(handle))
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            return _unreadable(index, f"cannot read GPU {index}: {exc}")
        memory = attempt(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        util = attempt(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        temperature = attempt(lambda: nvml.nvmlDeviceGetTemperature(handle, _TEMPERATURE_GPU))
        ecc = attempt(lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, _UNCORRECTED, _VOLATILE_ECC))
        remapped = attempt(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        power_mw = attempt(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        pending = bool(remapped[2]) if remapped is not None else None
        failed = bool(remapped[3]) if remapped is not None else None
        xids = self._xids.get(uuid)
        problems: list[str] = []
        if ecc:
            problems.append(f"{int(ecc)} uncorrected ECC errors")
        if failed:
            problems.append("row remapping failed")
        if xids:
            problems.append(f"{len(xids)} Xid errors, last Xid {xids[-1][1]}")
        return GpuInfo(
            index=index,
            name=name,
            uuid=uuid,
            util_pct=float(util.gpu) if util is not None else None,
            memory_used_mb=memory.used / MIB if memory is not None else None,
            memory_total_mb=memory.total / MIB if memory is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            remapped_pending=pending,
            remapped_failed=failed,
            xid_errors=len(xids) if xids is not None else None,
            error=bool(problems),
            power_watts=float(power_mw) / 1000.0 if power_mw is not None else None,
            last_xid=xids[-1][1] if xids else None,
            last_xid_age_s=self._clock() - xids[-1][0] if xids else None,
            problems=tuple(problems),
        )


def fake_gpu_uuids(env: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The UUIDs of ENV_FAKE_GPUS (the test seam; those its JSON file lists now), or None when
    it is unset."""
    fake = fake_gpus_from_env(env)
    return None if fake is None else tuple(gpu.uuid for gpu in fake.read())


def _unread(index: int, name: str, uuid: str, problems: tuple[str, ...] = ()) -> GpuInfo:
    """A GPU without readings: a fake one (no problems) or one NVML could not read."""
    return GpuInfo(
        index=index,
        name=name,
        uuid=uuid,
        util_pct=None,
        memory_used_mb=None,
        memory_total_mb=None,
        temperature_c=None,
        ecc_uncorrected=None,
        remapped_pending=None,
        remapped_failed=None,
        xid_errors=None,
        error=bool(problems),
        problems=problems,
    )


def _fake(index: int, gpu: FakeGpu, with_readings: bool) -> GpuInfo:
    """A fake GPU: bare (a UUID of the list), or with the Xids and ECC count of the JSON seam."""
    info = _unread(index, f"fake GPU ({ENV_FAKE_GPUS})", gpu.uuid)
    if not with_readings:
        return info
    problems = [f"{len(gpu.xids)} Xid errors, last Xid {gpu.xids[-1]}"] if gpu.xids else []
    if gpu.ecc_uncorrected:
        problems.insert(0, f"{gpu.ecc_uncorrected} uncorrected ECC errors")
    return dataclasses.replace(
        info,
        ecc_uncorrected=gpu.ecc_uncorrected,
        xid_errors=len(gpu.xids),
        last_xid=gpu.xids[-1] if gpu.xids else None,
        last_xid_age_s=0.0 if gpu.xids else None,
        error=bool(problems),
        problems=tuple(problems),
    )


def _unreadable(index: int, problem: str) -> GpuInfo:
    return _unread(index, "unknown", "", (problem,))


_default_reader = GpuReader()


def read_gpus(reader: GpuReader | None = None) -> list[GpuInfo]:
    """Every GPU of this host ([] without GPU or driver). Blocks: use `asyncio.to_thread`.

    Raises HealthError when the driver is loaded but fails.
    """
    return (reader or _default_reader).read()


def gpu_check(
    reader: GpuReader | None = None,
    degraded_temp_c: float = 85.0,
    unhealthy_temp_c: float = 95.0,
    xid_window_s: float = 600.0,
) -> CheckFn:
    """Unhealthy on uncorrected ECC errors, failed row remapping, an Xid within `xid_window_s`,
    an unreadable GPU or `unhealthy_temp_c`; degraded on a pending remap or `degraded_temp_c`."""
    source = reader or _default_reader

    async def check() -> CheckResult:
        gpus, reason = await asyncio.to_thread(source.read_with_reason)
        if not gpus:
            return CheckResult(HealthStatus.NOT_APPLICABLE, reason)
        worst = HealthStatus.HEALTHY
        notes: list[str] = []
        metrics: dict[str, float] = {"gpus": len(gpus)}
        for gpu in gpus:
            status, gpu_notes = _grade_gpu(gpu, degraded_temp_c, unhealthy_temp_c, xid_window_s)
            worst = max(worst, status, key=lambda s: s.severity)
            notes.extend(f"GPU {gpu.index}: {note}" for note in gpu_notes)
            for key in ("util_pct", "memory_used_mb", "temperature_c", "power_watts"):
                value = getattr(gpu, key)
                if value is not None:
                    metrics[f"gpu{gpu.index}_{key}"] = value
        message = "; ".join(notes) if notes else f"{len(gpus)} GPUs ok"
        return CheckResult(worst, message, metrics)

    return check


def _grade_gpu(
    gpu: GpuInfo, degraded_temp_c: float, unhealthy_temp_c: float, xid_window_s: float
) -> tuple[HealthStatus, list[str]]:
    """A GPU's status and notes; an Xid older than `xid_window_s` is mentioned, not graded."""
    bad: list[str] = [p for p in gpu.problems if "Xid" not in p]
    warn: list[str] = []
    info: list[str] = []
    if gpu.last_xid_age_s is not None and gpu.xid_errors:
        note = (
            f"{gpu.xid_errors} Xid errors, last Xid {gpu.last_xid} {gpu.last_xid_age_s:.0f} s ago"
        )
        (bad if gpu.last_xid_age_s < xid_window_s else info).append(note)
    if gpu.remapped_pending:
        warn.append("row remapping pending (reset the GPU to apply)")
    if gpu.temperature_c is not None and gpu.temperature_c >= degraded_temp_c:
        note = f"temperature {gpu.temperature_c:.0f} C"
        (bad if gpu.temperature_c >= unhealthy_temp_c else warn).append(note)
    if bad:
        status = HealthStatus.UNHEALTHY
    elif warn:
        status = HealthStatus.DEGRADED
    else:
        status = HealthStatus.HEALTHY
    return status, bad + warn + info
