"""Node providers: acquire, start, stop and release nodes (`static`: the inventory; `local`:
daemons on this machine), `acquire_node`, and auto-stop of idle nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.providers.acquire import acquire_node
    from node.providers.autostop import (
        LAST_DECISION_KEY,
        WAL_ENTRY_TYPE,
        AutoStop,
        AutostopPolicy,
        IdleChecks,
        IdleSample,
        nvml_utilization,
        recover_interrupted,
        should_act,
        take_sample,
    )
    from node.providers.base import (
        RELEASED,
        RUNNING,
        STOPPED,
        ActionResult,
        GPUQuery,
        NodeHandle,
        Provider,
    )
    from node.providers.local import LocalProvider
    from node.providers.ready import ReadyNode, ready_node
    from node.providers.static import StaticProvider, host_matches
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "node.providers.acquire": "acquire_node",
            "node.providers.autostop": (
                "LAST_DECISION_KEY WAL_ENTRY_TYPE AutoStop AutostopPolicy IdleChecks IdleSample "
                "nvml_utilization recover_interrupted should_act take_sample"
            ),
            "node.providers.base": (
                "RELEASED RUNNING STOPPED ActionResult GPUQuery NodeHandle Provider"
            ),
            "node.providers.local": "LocalProvider",
            "node.providers.ready": "ReadyNode ready_node",
            "node.providers.static": "StaticProvider host_matches",
        },
    )

__all__ = [
    "LAST_DECISION_KEY",
    "RELEASED",
    "RUNNING",
    "STOPPED",
    "WAL_ENTRY_TYPE",
    "ActionResult",
    "AutoStop",
    "AutostopPolicy",
    "GPUQuery",
    "IdleChecks",
    "IdleSample",
    "LocalProvider",
    "NodeHandle",
    "Provider",
    "ReadyNode",
    "StaticProvider",
    "acquire_node",
    "host_matches",
    "nvml_utilization",
    "ready_node",
    "recover_interrupted",
    "should_act",
    "take_sample",
]
