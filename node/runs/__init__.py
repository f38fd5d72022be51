"""Runs: the queue of runs on the coordinator (each step kept with the locks on a majority of
the voters), the nodes a run starts on, and the results store. The locks are node.locks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.lazy import lazy_exports

if TYPE_CHECKING:
    from node.runs.nodes import NodeStarter, ProviderNodes, StaticNodes
    from node.runs.queue import RunRecord, RunSpec, RunState, RunStep, parse_run_spec
    from node.runs.results import LocalResults, ResultsStore, open_results_store, result_key
    from node.runs.service import RunService
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
