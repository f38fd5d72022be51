"""The GPU quarantine routes' paths, bodies and answer: a node reports its own GPU
fault (POST /v1/gpu/quarantine) and asks to be re-admitted once its GPUs passed a self-test
(POST /v1/gpu/readmit), both at the coordinator (forwarded to it like drains)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from node.openapi import BODY_CONFIG, WireRecord

QUARANTINE_PATH = "/v1/gpu/quarantine"
READMIT_PATH = "/v1/gpu/readmit"
MAX_REASON_CHARS = 300
REASON_PREFIX = "gpu_fault: "
FaultName = Literal["unreadable", "recovery_action", "xid", "remap", "ecc"]
"""A health.FaultKind's value on the wire."""
_NODE = Field(
    pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
    description="the node whose GPU it is (the caller itself)",
)


class QuarantineBody(BaseModel):
    """Body of `POST /v1/gpu/quarantine`: the node, its faulty GPU and the fault."""

    model_config = BODY_CONFIG

    node: str = _NODE
    gpu: str = Field(max_length=100, description="the GPU's UUID")
    fault: FaultName = Field(description="what kind of fault (health.FaultKind)")
    reason: str = Field(
        min_length=len(REASON_PREFIX) + 1,
        max_length=MAX_REASON_CHARS,
        pattern=f"^{REASON_PREFIX}",
        description="what plans show, `gpu_fault: Xid 79 on GPU-...`",
    )


class ReadmitBody(BaseModel):
    """Body of `POST /v1/gpu/readmit`: the node, and how its GPUs' self-test passed."""

    model_config = BODY_CONFIG

    node: str = _NODE
    selftest: str = Field(max_length=MAX_REASON_CHARS, description="the self-test's outcome")


class QuarantineAnswer(WireRecord):
    """What the coordinator answers: whether the node is quarantined now, whether this call
    changed that, whether the quarantine is held (only `shoal node undrain` lifts it), how many
    quarantines the node had within the hour, and the reason plans show."""

    node: str
    coordinator: str
    quarantined: bool
    changed: bool
    held: bool = False
    count: int = 0
    reason: str | None = None
