"""The training series of a node's /metrics, read at scrape time: each of its ranks' step and
rate, and at the coordinator the ranks it flags as stragglers. (Restarts are counted by
node.training.restarts.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from node.training.progress import ProgressStore


class TrainingCollector(Collector):
    """shoal_training_step{rank}, shoal_training_steps_per_second{rank} of this node's ranks,
    shoal_training_stragglers and shoal_training_straggler{node,rank} (at the coordinator)."""

    def __init__(self, store: ProgressStore, stragglers: Callable[[], Mapping[int, str]]) -> None:
        self._store = store
        self._stragglers = stragglers

    def collect(self) -> Iterator[Metric]:
        step = GaugeMetricFamily(
            "shoal_training_step",
            "The last step each of this node's ranks reported",
            labels=["rank"],
        )
        rate = GaugeMetricFamily(
            "shoal_training_steps_per_second",
            "Steps per second of each of this node's ranks (over the last 30 s)",
            labels=["rank"],
        )
        for progress in self._store.ranks():
            step.add_metric([str(progress.rank)], float(progress.step))
            rate.add_metric([str(progress.rank)], progress.steps_per_s)
        yield step
        yield rate
        flagged = GaugeMetricFamily(
            "shoal_training_straggler",
            "1 for each rank the coordinator flags as a straggler",
            labels=["node", "rank"],
        )
        stragglers = self._stragglers()
        for rank, node in sorted(stragglers.items()):
            flagged.add_metric([node, str(rank)], 1.0)
        yield flagged
        yield GaugeMetricFamily(
            "shoal_training_stragglers",
            "Ranks the coordinator flags as stragglers now (0 elsewhere)",
            value=float(len(stragglers)),
        )
