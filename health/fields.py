"""Lenient readers of JSON another node sent: a missing field or one of the wrong type reads as
None (or empty), never as an exception, so one odd node cannot break whoever reads it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["read_bool", "read_float", "read_int", "read_list", "read_mapping", "read_str"]


def read_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def read_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def read_str(value: Any) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def read_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def read_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def read_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
