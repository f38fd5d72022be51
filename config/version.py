"""The installed shoal version."""

from __future__ import annotations

from importlib import metadata


def shoal_version() -> str:
    """The distribution's version, or `0+unknown` when run from a tree that is not installed."""
    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:
        return "0+unknown"
