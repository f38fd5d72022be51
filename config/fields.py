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


def _port(value: Any) -> int:
    text = str(value).strip() if isinstance(value, str) else value
    if isinstance(text, bool) or not (
        isinstance(text, int) or (isinstance(text, str) and text.isdigit())
    ):
        raise ValueError(f"must be an integer 1-65535, got {value!r}")
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"must be an integer 1-65535, got {value!r}")
    return port


def _node_id(value: Any) -> str:
    if not isinstance(value, str) or not _NODE_ID.match(value):
        raise ValueError(
            "must be 1-63 characters of letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit, got {value!r}"
        )
    return value


Port = Annotated[int, BeforeValidator(_port)]
NodeId = Annotated[str, BeforeValidator(_node_id)]


def is_valid_node_id(value: str) -> bool:
    """True when `value` may be used as a node id."""
    return bool(_NODE_ID.match(value))
