"""Field types shared by settings and the inventory, with messages that say what is allowed."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class Role(StrEnum):
    """What a node does; `auto` lets the coordinator decide."""

    AUTO = "auto"
    TRAINING = "training"
    INFERENCE = "inference"
    SELFPLAY = "selfplay"


class HostStatus(StrEnum):
    """Whether an inventory host takes part; only `ready` hosts get work."""

    READY = "ready"
    DISABLED = "disabled"
    MAINTENANCE = "maintenance"


class Category(StrEnum):
    """Data categories synced between nodes, each a directory under the data dir by default."""

    MODELS = "models"
    TRAINING = "training"
    CONFIGS = "configs"
    GAMES = "games"
    ROLLOUTS = "rollouts"


def _parse_port(value: Any, low: int, hint: str = "") -> int:
    text = value.strip() if isinstance(value, str) else value
    message = f"must be an integer {low}-65535{hint}, got {value!r}"
    if isinstance(text, bool) or not (
        isinstance(text, int) or (isinstance(text, str) and text.isdigit())
    ):
        raise ValueError(message)
    port = int(text)
    if not low <= port <= 65535:
        raise ValueError(message)
    return port


def _port(value: Any) -> int:
    return _parse_port(value, 1)


def _listen_port(value: Any) -> int:
    return _parse_port(value, 0, " (0 picks a free port)")


def _node_id(value: Any) -> str:
    if not isinstance(value, str) or not _NODE_ID.match(value):
        raise ValueError(
            "must be 1-63 characters of letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit, got {value!r}"
        )
    return value


Port = Annotated[int, BeforeValidator(_port)]
ListenPort = Annotated[int, BeforeValidator(_listen_port)]
NodeId = Annotated[str, BeforeValidator(_node_id)]


def is_valid_node_id(value: str) -> bool:
    """True when `value` may be used as a node id."""
    return bool(_NODE_ID.match(value))
