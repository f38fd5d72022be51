"""The rl routes' bodies, queries and answers: the weights routes (POST /v1/weights/update, GET
/v1/weights/next, POST /v1/weights/applied, GET /v1/weights/status, GET /v1/weights/runs) and the
rollouts backlog's (POST /v1/rollouts/consumed, GET /v1/rollouts/pending)."""

from __future__ import annotations

import re
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from node.openapi import BODY_CONFIG, Count, WireRecord
from node.rl.digest import ALGOS, SHA256_ALGO, Digest

RUN_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_POLL_S = 60.0
DEFAULT_POLL_S = 10.0
CONSUMED_PATH = "/v1/rollouts/consumed"
PENDING_PATH = "/v1/rollouts/pending"
TS_BOUND = 1.7e308
"""The largest |ts| of a consumed position: the document's bound, checked by the handler."""


_RUN = Field(
    pattern=RUN_PATTERN.pattern,
    description="the run's name: 1-64 letters, digits, '_', '.' or '-', not starting with "
    "'.', '_' or '-'",
)
_SHA = Field(
    default=None,
    pattern=r"^[0-9a-f]{64}$",
    description="the previous release's digest field (64 lowercase hex digits), read as "
    "digest {algo: sha256} when digest is absent; sent beside digest only when its algo is "
    "sha256",
)


class ParamBody(BaseModel):
    """One parameter of an offer, as the publisher describes it (ParamInfo.to_dict)."""

    model_config = BODY_CONFIG

    name: str
    shape: list[Count]
    dtype: str
    nbytes: Count


class DigestBody(BaseModel):
    """A weights digest: the algorithm and its value (docs/gpus.md defines them)."""

    model_config = BODY_CONFIG

    algo: str = Field(
        pattern=r"^[a-z0-9][a-z0-9.-]{0,31}$",
        description=f"the digest algorithm; this release knows {', '.join(ALGOS)}",
    )
    value: str = Field(pattern=r"^[0-9a-f]{16,128}$", description="lowercase hex digits")


def _digest_schema(schema: dict[str, Any]) -> None:
    """The schema of a DigestedBody: `digest` or `sha256` required, neither null."""
    for name in ("digest", "sha256"):
        found = schema["properties"][name]
        (kept,) = [b for b in found.pop("anyOf") if b.get("type") != "null"]
        found.pop("default", None)
        found.update(kept)
    schema["anyOf"] = [{"required": ["digest"]}, {"required": ["sha256"]}]


class DigestedBody(BaseModel):
    """A body that names weights by their digest: `digest`, or the previous release's
    `sha256` alone (read as digest {algo: sha256}); `sha256` beside `digest` is not read."""

    model_config = BODY_CONFIG | ConfigDict(json_schema_extra=_digest_schema)

    digest: DigestBody | None = Field(default=None, description="the weights' digest")
    sha256: str | None = _SHA

    @model_validator(mode="after")
    def _one_digest(self) -> Self:
        for name in ("digest", "sha256"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} must not be null: leave it out instead")
        if self.digest is None and self.sha256 is None:
            raise ValueError("give digest {algo, value} (or the previous release's sha256)")
        return self

    def weights_digest(self) -> Digest:
        if self.digest is not None:
            return Digest(self.digest.algo, self.digest.value)
        return Digest(SHA256_ALGO, str(self.sha256))

    def normalized(self) -> dict[str, Any]:
        """The body as a dict with `digest` always, `sha256` (equal to its value) only beside
        digest algo sha256."""
        dumped = self.model_dump(exclude={"digest", "sha256"})
        return {**dumped, **self.weights_digest().fields()}


class OfferBody(DigestedBody):
    """Body of `POST /v1/weights/update`: a new version's weights on offer."""

    run: str = _RUN
    version: Count = Field(description="the version; strictly increasing per run")
    params: list[ParamBody] = Field(description="every parameter, in broadcast order")
    total_bytes: Count
    deadline_s: float = Field(ge=0, description="seconds the publisher waits for receivers")
    sent_at: float = Field(default=0, ge=0, description="unix seconds the trainer sent it")
    group: dict[str, Any] | None = Field(
        default=None, description="the broadcast group: master_addr, master_port, prefix"
    )


class AppliedBody(DigestedBody):
    """Body of `POST /v1/weights/applied`: the weights a local process applied or published."""

    run: str = _RUN
    version: Count
    bytes: Count
    source: Literal["broadcast", "file"] = Field(description="'broadcast' or 'file'")
    receivers: list[str] = Field(default_factory=list, description="node ids that acknowledged")
    sent_at: float | None = Field(default=None, ge=0, description="unix seconds it was sent")


class RunQuery(BaseModel):
    run: str = Field(pattern=RUN_PATTERN.pattern, description="the run's name")


class NextQuery(RunQuery):
    after: int = Field(default=-1, ge=-1, le=2**63 - 1, description="last version held")
    timeout_s: float = Field(
        default=DEFAULT_POLL_S,
        ge=0,
        le=MAX_POLL_S,
        description=f"seconds to wait, 0 to {MAX_POLL_S:g} (default {DEFAULT_POLL_S:g})",
    )


class ConsumedBody(BaseModel):
    """Body of `POST /v1/rollouts/consumed`: the last sample consumed, in (created_at,
    sample_id) order (the handler checks it the same way)."""

    model_config = BODY_CONFIG

    run: str = Field(pattern=RUN_PATTERN.pattern)
    ts: float = Field(ge=-TS_BOUND, le=TS_BOUND)
    after: str


class Consumed(WireRecord):
    """The last sample a run's trainer consumed."""

    ts: float
    after: str


class BacklogAnswer(WireRecord):
    """A run's backlog on this node: unconsumed rollouts, the cap, what was consumed."""

    run: str
    pending: int = Field(ge=0)
    max_pending: int = Field(ge=1)
    consumed: Consumed | None
