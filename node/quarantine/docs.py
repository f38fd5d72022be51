"""The GPU quarantine routes' paths, bodies, answer and documentation: a node reports its own GPU
fault (POST /v1/gpu/quarantine) and asks to be re-admitted once its GPUs passed a self-test
(POST /v1/gpu/readmit), both at the coordinator (forwarded to it like drains)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from node.openapi import BODY_CONFIG, RouteDoc, WireRecord

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


_ANSWERS = (
    (400, "bad request"),
    (403, "a node reports only its own GPUs; clients may not report"),
    (503, "no coordinator or no quorum of voters: report again"),
)


def quarantine_route_docs() -> list[RouteDoc]:
    """The documentation of the quarantine and re-admission routes."""
    return [
        RouteDoc(
            "POST",
            QUARANTINE_PATH,
            "Peers only: the calling node reports a fault of its own GPU "
            '{"node", "gpu", "fault", "reason"}; the coordinator quarantines it (kept on a '
            "majority of the voters): it leaves the training group in the next plan, with "
            "the reason in cannot_train. Repeating it changes nothing",
            ((200, "quarantined (or already was)"), *_ANSWERS),
            body=QuarantineBody,
            response=QuarantineAnswer,
        ),
        RouteDoc(
            "POST",
            READMIT_PATH,
            'Peers only: the calling node, whose GPUs passed a self-test {"node", "selftest"}, '
            "asks to be re-admitted; it trains again from the next plan",
            (
                (200, "re-admitted (or was not quarantined)"),
                *_ANSWERS,
                (409, "the quarantine is held: shoal node undrain NODE lifts it"),
            ),
            body=ReadmitBody,
            response=QuarantineAnswer,
        ),
    ]
