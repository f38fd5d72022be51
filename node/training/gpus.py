"""This node's GPU readings of the last 15 minutes: utilization and memory of each GPU it owns,
one NVML reading every SAMPLE_S on the wall clock's grid (the grid of the ranks' samples), kept
in a ring of bounded size; GET /v1/training?history=1 serves them beside the ranks' history."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from node.training.models import GpuHistory
from node.training.progress import HISTORY_S, SAMPLE_S

log = logging.getLogger(__name__)

MAX_GPUS = 64
"""GPUs kept per node (a host has at most 16 today): the ring's size is bounded whatever NVML
says."""
MAX_SAMPLES = int(HISTORY_S / SAMPLE_S) + 1

Readings = Sequence[Mapping[str, Any]]
"""GpuInfo.to_json() of every GPU of the host (NodeRuntime.gpus)."""


@dataclass
class _Gpu:
    index: int
    uuid: str
    name: str
    memory_total_mb: float | None
    samples: deque[tuple[float, float | None, float | None]] = field(
        default_factory=lambda: deque(maxlen=MAX_SAMPLES)
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return round(float(value), 1)


class GpuRing:
    """The last HISTORY_S of readings of the GPUs at `owned` NVML indices (at most MAX_GPUS,
    MAX_SAMPLES each). Not thread-safe (the event loop's)."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall_clock = wall_clock
        self._gpus: dict[int, _Gpu] = {}

    def record(self, readings: Readings, owned: Sequence[int]) -> None:
        """Keep one sample of each owned GPU (a GPU missing from `readings`: a gap)."""
        at = round(self._wall_clock(), 3)
        by_index = {reading.get("index"): reading for reading in readings}
        for index in list(owned)[:MAX_GPUS]:
            reading = by_index.get(index, {})
            gpu = self._gpus.get(index)
            if gpu is None:
                gpu = self._gpus[index] = _Gpu(index, "", "", None)
            gpu.uuid = str(reading.get("uuid") or gpu.uuid)
            gpu.name = str(reading.get("name") or gpu.name)
            gpu.memory_total_mb = _number(reading.get("memory_total_mb")) or gpu.memory_total_mb
            util, used = _number(reading.get("util_pct")), _number(reading.get("memory_used_mb"))
            gpu.samples.append((at, util, used))
        for gpu in self._gpus.values():
            while gpu.samples and gpu.samples[0][0] < at - HISTORY_S:
                gpu.samples.popleft()

    def history(self) -> list[GpuHistory]:
        """Every owned GPU's samples, by NVML index."""
        return [
            GpuHistory(
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                memory_total_mb=gpu.memory_total_mb,
                at=[sample[0] for sample in gpu.samples],
                util_pct=[sample[1] for sample in gpu.samples],
                memory_used_mb=[sample[2] for sample in gpu.samples],
            )
            for _, gpu in sorted(self._gpus.items())
        ]


def next_sample_at(now: float, sample_s: float = SAMPLE_S) -> float:
    """The next point of the wall clock's grid of `sample_s` after `now`."""
    return (math.floor(now / sample_s) + 1) * sample_s


class GpuSampler:
    """Reads the host's GPUs (`read`, blocking: NodeRuntime.gpus) on a thread every SAMPLE_S
    into `ring`, each read awaited at most `deadline_s`; a read still running when the next is
    due is not doubled (that sample is a gap). Only while `owned()` names GPUs."""

    def __init__(
        self,
        ring: GpuRing,
        read: Callable[[], Readings],
        owned: Callable[[], Sequence[int]],
        deadline_s: float,
        *,
        sample_s: float = SAMPLE_S,
    ) -> None:
        self.ring = ring
        self._read = read
        self._owned = owned
        self._deadline_s = deadline_s
        self._sample_s = sample_s
        self._reading: asyncio.Future[Readings] | None = None

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            now = time.time()
            await asyncio.sleep(next_sample_at(now, self._sample_s) - now)
            owned = self._owned()
            if owned:
                self.ring.record(await self.read(), owned)

    async def read(self) -> Readings:
        """The readings, or none (every GPU a gap) when the read fails or is late."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(asyncio.to_thread(self._read))
            self._reading.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(self._reading), self._deadline_s)
        except Exception as exc:  # a gap in the plot; the gpu health check reports the driver
            log.debug("GPU history: no reading this round: %r", exc)
            return ()


def _retrieve(future: asyncio.Future[Readings]) -> None:
    with contextlib.suppress(asyncio.CancelledError, Exception):
        future.exception()
