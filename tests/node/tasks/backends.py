"""Context managers that give the contract suite a `shoal` context (a real daemon, its workers
started as jobs) and a `ray` context (a local Ray started here, small)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.node.jobs.client_daemon import ROOT, served_node

RAY_CPUS = 2


@contextlib.contextmanager
def shoal_context(workdir: Path, workers_per_node: int = 2) -> Iterator[Any]:
    from node.tasks.shoal import ShoalContext

    with served_node(workdir) as node:
        context = ShoalContext(
            node.url,
            config_file=str(node.config_file),
            workers_per_node=workers_per_node,
            env={"PYTHONPATH": str(ROOT)},
        )
        try:
            yield context
        finally:
            context.close()


@contextlib.contextmanager
def ray_context() -> Iterator[Any]:
    from node.tasks.ray_backend import RayContext

    context = RayContext(
        init_kwargs={
            "num_cpus": RAY_CPUS,
            "include_dashboard": False,
            "runtime_env": {"env_vars": {"PYTHONPATH": str(ROOT)}},
            "log_to_driver": False,
        }
    )
    try:
        yield context
    finally:
        context.close()
        os.environ.pop("RAY_ADDRESS", None)
