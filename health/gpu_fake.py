"""TEST SEAM, never for production: `SHOAL_TEST_FAKE_GPUS` makes a GpuReader report fake GPUs
instead of asking NVML, so tests give nodes GPUs (and GPU faults) on any host.

The variable holds either comma-separated GPU UUIDs (GPUs without readings), or the path of a
JSON file `{"gpus": [{"uuid": "GPU-...", "xids": [79], "ecc_uncorrected": 0, "selftest": "pass"}]}`
(every field but `uuid` optional) that is read again at every read, so a test injects and
clears faults on a running node. Replace the file whole (write another, rename it over).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from health.errors import HealthError
from health.gpu_faults import FaultSample, unreadable_sample

__all__ = [
    "ENV_FAKE_GPUS",
    "FakeGpu",
    "FakeGpus",
    "fake_gpus_from_env",
    "fake_sample",
    "write_fake_gpus",
]

ENV_FAKE_GPUS = "SHOAL_TEST_FAKE_GPUS"
"""TEST SEAM, never for production: comma-separated GPU UUIDs, or the path of a JSON file of
fake GPUs (see this module), that a GpuReader reports as this host's GPUs (index i: the i-th)."""


class FakeGpu(BaseModel):
    """One fake GPU of the JSON seam: the Xids it reports now (an emptied list clears them), its
    volatile uncorrected ECC count (a rise is a fault) and how its self-test ends."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uuid: str = Field(min_length=1)
    xids: tuple[int, ...] = ()
    ecc_uncorrected: int = Field(0, ge=0)
    selftest: Literal["pass", "fail"] = "pass"


class FakeGpuFile(BaseModel):
    """The JSON seam's file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: tuple[FakeGpu, ...]


@dataclass(frozen=True)
class FakeGpus:
    """The fake GPUs an ENV_FAKE_GPUS value names: `uuids` (a fixed list, no readings) or a
    JSON `file` read again by every `read()`."""

    uuids: tuple[str, ...] = ()
    file: Path | None = None

    @property
    def with_readings(self) -> bool:
        """Whether the GPUs carry readings (the JSON seam) rather than bare UUIDs."""
        return self.file is not None

    def read(self) -> tuple[FakeGpu, ...]:
        """The fake GPUs now; HealthError naming the file when it cannot be read."""
        if self.file is None:
            return tuple(FakeGpu(uuid=uuid) for uuid in self.uuids)
        try:
            text = self.file.read_text(encoding="utf-8")
            return FakeGpuFile.model_validate_json(text).gpus
        except (OSError, ValidationError) as exc:
            raise HealthError(f"{ENV_FAKE_GPUS} file {self.file}: {exc}") from exc


def fake_gpus_from_env(env: Mapping[str, str] | None = None) -> FakeGpus | None:
    """The fake GPUs ENV_FAKE_GPUS names, or None when it is unset. A value holding a path
    separator or ending in `.json` is the JSON file's path; anything else lists UUIDs."""
    text = (os.environ if env is None else env).get(ENV_FAKE_GPUS)
    if text is None:
        return None
    value = text.strip()
    if value.endswith(".json") or os.sep in value:
        return FakeGpus(file=Path(value))
    return FakeGpus(uuids=tuple(part.strip() for part in value.split(",") if part.strip()))


def write_fake_gpus(path: Path, gpus: Sequence[FakeGpu]) -> None:
    """Write the JSON seam's file whole (a temporary file renamed over it): a reader never sees
    half of it."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(FakeGpuFile(gpus=tuple(gpus)).model_dump_json(), encoding="utf-8")
    os.replace(temporary, path)


def fake_sample(index: int, gpus: Sequence[FakeGpu]) -> FaultSample:
    """The fault read of fake GPU `index`; unreadable when the seam's file no longer lists it."""
    if index >= len(gpus):
        return unreadable_sample(index, "", f"{ENV_FAKE_GPUS} lists {len(gpus)} GPUs")
    gpu = gpus[index]
    return FaultSample(
        index=index,
        uuid=gpu.uuid,
        xids=gpu.xids,
        ecc_uncorrected=gpu.ecc_uncorrected,
        selftest=gpu.selftest,
    )
