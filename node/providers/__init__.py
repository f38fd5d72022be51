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
    from node.providers.decision import AutostopDecision
    from node.providers.local import LocalProvider
    from node.providers.ready import ReadyNode, ready_node
    from node.providers.static import StaticProvider, host_matches
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
