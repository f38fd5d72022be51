"""The installed shoal version."""

from __future__ import annotations


def shoal_version() -> str:
    """The distribution's version, or `0+unknown` when run from a tree that is not installed."""
    from importlib import metadata  # here: `shoal --help` (which prints no version) skips it

    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:
        return "0+unknown"
