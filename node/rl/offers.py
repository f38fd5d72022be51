"""What the weights control plane says on the wire: an offer of a run's new version
(WeightsOffer), the weights applied on a node (WeightsStatus) and per run (WeightsRuns), and their
digest and parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue

from node.openapi import Number, WireRecord
from node.rl.digest import Digest


class DigestRecord(WireRecord):
    """A weights digest in an offer or a status: the algorithm and its value."""

    algo: str
    value: str


class ParamRecord(WireRecord):
    """One parameter of an offer: name, shape, dtype and size in bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


_ONLY_SHA256 = Field(
    default=None,
    exclude_if=lambda sha256: sha256 is None,
    description="the digest's value again, only when its algo is sha256",
)


class WeightsOffer(WireRecord):
    """A weights offer, as `GET /v1/weights/next` answers it: a run's new version, its
    parameters in broadcast order, its digest, how long the publisher waits and its group."""

    run: str
    version: int
    params: tuple[ParamRecord, ...]
    total_bytes: int
    deadline_s: Number
    sent_at: Number
    group: dict[str, JsonValue] | None = Field(
        description="the broadcast group: master_addr, master_port, prefix"
    )
    digest: DigestRecord
    sha256: str | None = _ONLY_SHA256

    def weights_digest(self) -> Digest:
        return Digest(self.digest.algo, self.digest.value)


class WeightsStatus(WireRecord):
    """The weights applied for a run on a node (the answer of `POST /v1/weights/applied` and
    `GET /v1/weights/status`)."""

    run: str
    version: int
    digest: DigestRecord
    sha256: str | None = _ONLY_SHA256
    applied_at: Number
    source: Literal["broadcast", "file"]
    bytes: int


class WeightsRuns(WireRecord):
    """The runs a node knows weights of (the answer of `GET /v1/weights/runs`): each run's
    applied weights, or None where an offer came but nothing is applied yet."""

    runs: dict[str, WeightsStatus | None]


class OfferTaken(WireRecord):
    """The answer of `POST /v1/weights/update`: the run's version is on offer here."""

    run: str
    version: int
    offered: Literal[True] = True
