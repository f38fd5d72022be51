"""OpenAPI notes of the keyring routes (node.keyring.routes), and the models their bodies are
validated with (the document's schemas are generated from them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from node.membership.keyring import KEY_ID_CHARS
from node.openapi import BODY_CONFIG, RouteDoc

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


LOCAL_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["node", "primary", "keys"],
    "properties": {
        "node": {"type": "string"},
        "primary": {"type": "string", "description": "the key id this node seals with"},
        "keys": {"type": "array", "items": {"type": "string"}, "description": "every key id"},
        "file": {"type": "string"},
    },
}
FAILED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"type": "string"},
    "description": "member -> why it did not answer or acknowledge",
}
CLUSTER_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["coordinator", "members", "keys", "failed"],
    "properties": {
        "coordinator": {"type": "string"},
        "members": {"type": "object", "additionalProperties": LOCAL_ANSWER},
        "keys": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "members", "in_use_by"],
                "properties": {
                    "id": {"type": "string"},
                    "members": {"type": "integer", "description": "members that hold it"},
                    "in_use_by": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        "failed": FAILED_SCHEMA,
    },
}
CHANGE_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["op", "key_id", "coordinator", "acked", "failed"],
    "properties": {
        "op": {"enum": list(OPERATIONS)},
        "key_id": {"type": "string"},
        "coordinator": {"type": "string"},
        "acked": {"type": "array", "items": {"type": "string"}},
        "failed": FAILED_SCHEMA,
    },
}
_CLUSTER_REFUSALS = (
    (503, "no coordinator, or the coordinator is unreachable"),
    (400, "bad request"),
)
_CLUSTER_SUMMARIES = {
    "install": 'Install a key {"key"} on every alive member: accepted on receipt there',
    "use": 'Seal with key {"key_id"} on every alive member (each must hold it: else 409 '
    "key_missing naming them)",
    "remove": 'Remove key {"key_id"} from every alive member; 409 key_in_use while any '
    "member seals with it",
}
_LOCAL_SUMMARIES = {
    "install": 'This node only: install a key {"key"}',
    "use": 'This node only: seal with key {"key_id"} (404 when not installed)',
    "remove": 'This node only: remove key {"key_id"} (409 when in use)',
}


def keyring_route_docs() -> list[RouteDoc]:
    """The RouteDocs of every keyring route: the two lists, then per operation the cluster's
    change and this node's."""
    docs = [
        RouteDoc(
            "GET",
            KEYRING_PATH,
            "The cluster's gossip keys (from the coordinator, which asks every alive "
            "member): each key id, how many members hold it, which members seal with it; "
            "never a key's bytes",
            ((200, "the keys of every member"), _CLUSTER_REFUSALS[0]),
            response=CLUSTER_ANSWER,
        ),
        RouteDoc(
            "GET",
            LOCAL_PATH,
            "This node's gossip keyring: its key ids and the one it seals with",
            ((200, "this node's keyring"), (409, "this node has no keyring")),
            response=LOCAL_ANSWER,
        ),
    ]
    for op in OPERATIONS:
        docs.append(_cluster_change_doc(op))
        docs.append(_local_change_doc(op))
    return docs


def _body_of(op: str) -> type[InstallBody] | type[KeyIdBody]:
    return InstallBody if op == "install" else KeyIdBody


def _cluster_change_doc(op: str) -> RouteDoc:
    return RouteDoc(
        "POST",
        f"{KEYRING_PATH}/{op}",
        f"{_CLUSTER_SUMMARIES[op]}; answers which members acknowledged and which did not",
        (
            (200, "done on the members in acked; failed names the others"),
            (404, "no member holds the key"),
            (409, "refused: key_in_use or key_missing, nothing changed"),
            *_CLUSTER_REFUSALS,
        ),
        body=_body_of(op),
        response=CHANGE_ANSWER,
    )


def _local_change_doc(op: str) -> RouteDoc:
    return RouteDoc(
        "POST",
        f"{LOCAL_PATH}/{op}",
        f"{_LOCAL_SUMMARIES[op]}; recorded in the WAL (audit kind keyring)",
        (
            (200, "this node's keyring after the change"),
            (400, "bad request"),
            (404, "the key is not installed here"),
            (409, "the key is in use, or this node has no keyring"),
        ),
        body=_body_of(op),
        response=LOCAL_ANSWER,
    )
