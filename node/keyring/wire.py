"""The keyring routes' paths, the models their bodies are validated with and their answers
(node.keyring.routes declares the routes with them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from node.membership.keyring import KEY_ID_CHARS
from node.openapi import BODY_CONFIG, WireRecord

KEYRING_PATH = "/v1/keyring"
LOCAL_PATH = "/v1/keyring/local"
OPERATIONS = ("install", "use", "remove")

_KEY_ID = Field(
    min_length=KEY_ID_CHARS,
    max_length=KEY_ID_CHARS,
    pattern=f"^[0-9a-f]{{{KEY_ID_CHARS}}}$",
    description="a key id (16 hex characters)",
)


class InstallBody(BaseModel):
    """Body of `POST /v1/keyring/install` (and `.../local/install`)."""

    model_config = BODY_CONFIG

    key: str = Field(
        min_length=1,
        max_length=200,
        description="the key, sealed with a key derived from the cluster secret "
        "(node.membership.keyring.wrap_key; `sealed: secret`), or plain base64 (`sealed: "
        "tls`, taken only over TLS, or on a node without a secret)",
    )
    sealed: Literal["secret", "tls"] = Field(
        default="secret",
        description="how the key travels: `secret`, sealed with the cluster secret; `tls`, "
        "plain inside a TLS connection (an operator with a certificate and no secret)",
    )
    requested_by: str | None = Field(
        default=None, max_length=200, description="who asked the coordinator (audit)"
    )


class KeyIdBody(BaseModel):
    """Body of `POST /v1/keyring/use|remove` (and `.../local/use|remove`)."""

    model_config = BODY_CONFIG

    key_id: str = _KEY_ID
    requested_by: str | None = Field(
        default=None, max_length=200, description="who asked the coordinator (audit)"
    )


Failed = dict[str, str]
"""member -> why it did not answer or acknowledge."""


class LocalAnswer(WireRecord):
    """A node's own gossip keyring: its key ids and the one it seals with."""

    node: str
    primary: str = Field(description="the key id this node seals with")
    keys: list[str] = Field(description="every key id")
    file: str | None = None


class KeyHolders(WireRecord):
    """One key id: how many members hold it, which seal with it."""

    id: str
    members: int = Field(description="members that hold it")
    in_use_by: list[str]


class ClusterAnswer(WireRecord):
    """The cluster's gossip keys, from the coordinator: each member's keyring, each key."""

    coordinator: str
    members: dict[str, LocalAnswer]
    keys: list[KeyHolders]
    failed: Failed


class ChangeAnswer(WireRecord):
    """A change made on every alive member: who acknowledged it, who did not."""

    op: Literal["install", "use", "remove"]
    key_id: str
    coordinator: str
    acked: list[str]
    failed: Failed


def summarize(members: dict[str, LocalAnswer]) -> list[KeyHolders]:
    """Every key id the members hold: how many hold it, which members seal with it."""
    ids = sorted({kid for state in members.values() for kid in state.keys})
    return [
        KeyHolders(
            id=kid,
            members=sum(1 for state in members.values() if kid in state.keys),
            in_use_by=sorted(n for n, state in members.items() if state.primary == kid),
        )
        for kid in ids
    ]
