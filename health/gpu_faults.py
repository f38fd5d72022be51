"""GPU faults that take a node out of training: what one read of a GPU's fault sources holds
(Xid events, the uncorrected ECC count, the row-remapping failure flag, the driver's recovery
action, whether NVML can read it at all), and the pure rule that says which of it is a fault.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from health.xids import XID_TABLE, XidAction

__all__ = [
    "GPU_ID_HEX_DIGITS",
    "FaultKind",
    "FaultSample",
    "FaultVerdict",
    "GpuFault",
    "RecoveryAction",
    "judge",
    "sample_nvml",
    "short_gpu_id",
    "unreadable_sample",
    "with_xids",
]

GPU_ID_HEX_DIGITS = 10
"""Hex digits of an NVML UUID that name a GPU in plans and reasons (and that nodes advertise:
40 bits tell the GPUs of a large cluster apart, and keep a node's gossiped meta small)."""
_NVML_UUID = re.compile(
    r"^GPU-([0-9a-fA-F]{8})-([0-9a-fA-F]{4})-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
UNREADABLE_CHARS = 80
"""At most this much of why a GPU cannot be read goes into a fault's reason."""
_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
_VOLATILE_ECC = 0  # NVML_VOLATILE_ECC: since the driver was loaded
_GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST
_RECOVERY_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (newer drivers only)


class FaultKind(enum.StrEnum):
    """What kind of fault a GPU has."""

    UNREADABLE = "unreadable"
    RECOVERY = "recovery_action"
    XID = "xid"
    REMAP = "remap"
    ECC = "ecc"


class RecoveryAction(enum.StrEnum):
    """The recovery action the driver reports for a GPU (NVML_GPU_RECOVERY_ACTION_*): anything
    but `none` means the GPU needs that before it is used again."""

    NONE = "none"
    GPU_RESET = "gpu_reset"
    NODE_REBOOT = "node_reboot"
    DRAIN_P2P = "drain_p2p"
    DRAIN_AND_RESET = "drain_and_reset"
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    BUS_RESET = "bus_reset"
    SYSTEM_REBOOT = "system_reboot"


_RECOVERY_CODES = tuple(RecoveryAction)  # NVML's codes 0..7, in its order


@dataclass(frozen=True)
class FaultSample:
    """One read of one GPU's fault sources. `xids`: the Xid events since the previous read (the
    fake seam: the Xids its file lists now); None where a reading is not supported;
    `recovery`: the driver's recovery action, None when the driver reports none;
    `unreadable`: why NVML cannot read the GPU (None: it can); `selftest`: the fake seam's."""

    index: int
    uuid: str
    xids: tuple[int, ...] = ()
    ecc_uncorrected: int | None = None
    remap_failed: bool | None = None
    recovery: RecoveryAction | None = None
    unreadable: str | None = None
    selftest: str | None = None


def short_gpu_id(uuid: str) -> str:
    """How plans name a GPU: its NVML UUID cut to GPU_ID_HEX_DIGITS hex digits, written as the
    start of the UUID (`GPU-5d8f0e1c-2a` for `GPU-5d8f0e1c-2a3b-...`, which is what
    `nvidia-smi -L` prints first); any other text as it is."""
    match = _NVML_UUID.match(uuid)
    if match is None:
        return uuid
    first, second = match.group(1).lower(), match.group(2).lower()
    return f"GPU-{first}-{second[: GPU_ID_HEX_DIGITS - len(first)]}"


@dataclass(frozen=True)
class GpuFault:
    """A fault of one GPU; `reason` is how plans name it: `gpu_fault: Xid 79 on GPU-5d8f0e1c-2a`
    (the GPU as `short_gpu_id` writes it)."""

    uuid: str
    kind: FaultKind
    detail: str

    @property
    def reason(self) -> str:
        return f"gpu_fault: {self.detail} on {short_gpu_id(self.uuid)}"


@dataclass(frozen=True)
class FaultVerdict:
    """The faults of one read (the first is the one a quarantine names), and what was read
    that is no fault (an application's Xid), in words."""

    faults: tuple[GpuFault, ...] = ()
    ignored: tuple[str, ...] = ()


def judge(sample: FaultSample, previous: FaultSample | None = None) -> FaultVerdict:
    """The faults in `sample` (the GPU's `previous` read tells whether its ECC count rose).

    A fault: the GPU cannot be read; the driver reports a recovery action other than none; an
    Xid the table (health.xids) marks `quarantine`, unless the driver reports its recovery
    action (its own classification beats the table: `none` then means the GPU is usable);
    failed row remapping; an uncorrected ECC count above the previous read's. An application
    Xid, or one the table does not list, is never a fault."""
    uuid = sample.uuid or f"GPU index {sample.index}"
    if sample.unreadable is not None:
        why = sample.unreadable[:UNREADABLE_CHARS]
        return FaultVerdict((GpuFault(uuid, FaultKind.UNREADABLE, f"unreadable ({why})"),))
    faults: list[GpuFault] = []
    ignored: list[str] = []
    driver_decides = sample.recovery is not None
    if sample.recovery is not None and sample.recovery is not RecoveryAction.NONE:
        detail = f"recovery action {sample.recovery.value}"
        faults.append(GpuFault(uuid, FaultKind.RECOVERY, detail))
    for code in dict.fromkeys(sample.xids):
        entry = XID_TABLE.get(code)
        if entry is None:
            ignored.append(f"Xid {code} on {uuid}: not in shoal's Xid table")
        elif entry.action is XidAction.APPLICATION:
            ignored.append(f"Xid {code} on {uuid}: an application error ({entry.name})")
        elif driver_decides:
            ignored.append(f"Xid {code} on {uuid}: the driver asks {sample.recovery}")
        else:
            faults.append(GpuFault(uuid, FaultKind.XID, f"Xid {code}"))
    if sample.remap_failed:
        faults.append(GpuFault(uuid, FaultKind.REMAP, "row remapping failed"))
    before = None if previous is None else previous.ecc_uncorrected
    now = sample.ecc_uncorrected
    if before is not None and now is not None and now > before:
        detail = f"uncorrected ECC errors rose {before} -> {now}"
        faults.append(GpuFault(uuid, FaultKind.ECC, detail))
    return FaultVerdict(tuple(faults), tuple(ignored))


def unreadable_sample(index: int, uuid: str, why: str) -> FaultSample:
    """The read of a GPU that cannot be read, and why."""
    return FaultSample(index=index, uuid=uuid, unreadable=why)


def sample_nvml(nvml: ModuleType, handle: Any, index: int, uuid: str) -> FaultSample:
    """The ECC count, the row-remapping failure flag and the recovery action of the GPU at
    `handle` (each None where unsupported; a GPU the driver says is lost is unreadable). The
    Xid events are the caller's: they come from its event set."""
    readings: dict[str, Any] = {}
    calls: dict[str, Callable[[], object]] = {
        "ecc": lambda: int(nvml.nvmlDeviceGetTotalEccErrors(handle, _UNCORRECTED, _VOLATILE_ECC)),
        "remap": lambda: bool(nvml.nvmlDeviceGetRemappedRows(handle)[3]),
        "recovery": lambda: _recovery_action(nvml, handle),
    }
    for name, call in calls.items():
        try:
            readings[name] = call()
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == _GPU_IS_LOST:
                return unreadable_sample(index, uuid, f"NVML: {exc}")
            readings[name] = None
    return FaultSample(
        index=index,
        uuid=uuid,
        ecc_uncorrected=readings["ecc"],
        remap_failed=readings["remap"],
        recovery=readings["recovery"],
    )


def _recovery_action(nvml: ModuleType, handle: Any) -> RecoveryAction | None:
    """The driver's recovery action for the GPU, None where the driver or library has none."""
    read = getattr(nvml, "nvmlDeviceGetFieldValues", None)
    if read is None:
        return None
    [value] = read(handle, [_RECOVERY_FIELD])
    if int(value.nvmlReturn) != 0:
        return None
    code = int(value.value.uiVal)
    return _RECOVERY_CODES[code] if 0 <= code < len(_RECOVERY_CODES) else None


def with_xids(sample: FaultSample, xids: tuple[int, ...]) -> FaultSample:
    """`sample` with the Xid events read beside it."""
    return replace(sample, xids=xids)
