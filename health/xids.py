"""NVIDIA's Xid catalog as shoal acts on it: the Xids that quarantine a GPU (it needs a reset, a
reboot or a replacement) and the application's Xids, which never do. The one table of them:
docs/fault-tolerance.md's Xid table is checked against it by a test.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["XID_TABLE", "XidAction", "XidEntry", "xid_action"]


class XidAction(enum.StrEnum):
    """What an Xid makes shoal do with the GPU that reported it."""

    QUARANTINE = "quarantine"
    """The GPU needs a reset, a reboot or a replacement: its node leaves the training group."""
    APPLICATION = "application"
    """The process that used the GPU failed (its own bug, or killed after another error); the
    GPU is fine: nothing happens beyond the worker's own restart."""


@dataclass(frozen=True)
class XidEntry:
    """One Xid: its code, NVIDIA's name for it, what shoal does, and what brings the GPU (or the
    application) back, in words, after NVIDIA's Xid catalog and gpud's table."""

    code: int
    name: str
    action: XidAction
    resolution: str


_Q, _A = XidAction.QUARANTINE, XidAction.APPLICATION
_ENTRIES = (
    XidEntry(8, "GPU stopped processing", _A, "restart the application"),
    XidEntry(13, "Graphics engine exception", _A, "restart the application"),
    XidEntry(31, "GPU memory page fault", _A, "restart the application"),
    XidEntry(43, "GPU stopped processing (a process faulted)", _A, "restart the application"),
    XidEntry(45, "Preemptive cleanup, due to previous errors", _A, "restart the application"),
    XidEntry(48, "Double-bit ECC error", _Q, "reset the GPU"),
    XidEntry(61, "Internal micro-controller breakpoint/warning", _Q, "reset the GPU"),
    XidEntry(62, "Internal micro-controller halt", _Q, "reset the GPU"),
    XidEntry(63, "Row remapping (or page retirement) recorded", _Q, "reset the GPU to remap"),
    XidEntry(64, "Row remapping (or page retirement) failed", _Q, "reset the GPU; replace it"),
    XidEntry(68, "Video decoder exception", _A, "restart the application"),
    XidEntry(69, "Graphics engine class error", _A, "restart the application"),
    XidEntry(74, "NVLink error", _Q, "reset the GPU; check its NVLinks"),
    XidEntry(79, "GPU has fallen off the bus", _Q, "reboot the node; replace the GPU if again"),
    XidEntry(92, "High single-bit ECC error rate", _Q, "reset the GPU; replace it if again"),
    XidEntry(94, "Contained uncorrectable ECC error", _Q, "restart the application; reset the GPU"),
    XidEntry(95, "Uncontained uncorrectable ECC error", _Q, "reset the GPU"),
    XidEntry(109, "Context switch timeout", _A, "restart the application"),
    XidEntry(119, "GSP RPC timeout", _Q, "reset the GPU"),
    XidEntry(120, "GSP error", _Q, "reset the GPU"),
    XidEntry(140, "Unrecovered ECC error", _Q, "reset the GPU"),
    XidEntry(154, "GPU recovery action changed", _Q, "what the recovery action says"),
)

XID_TABLE: Mapping[int, XidEntry] = {entry.code: entry for entry in _ENTRIES}
"""Every Xid shoal classifies, by code. An Xid not listed here quarantines nothing by itself (a
GPU that also reports a recovery action, or cannot be read, is quarantined for that)."""


def xid_action(code: int) -> XidAction | None:
    """What Xid `code` makes shoal do; None for an Xid the table does not list."""
    entry = XID_TABLE.get(code)
    return None if entry is None else entry.action
