"""Setting names across the layered sources (config file, environment, flags): dotted names
of nested sections, and where a setting's value came from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def put_setting(target: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `value` at the dotted setting name `dotted` (`jobs.run_as`) in `target`."""
    head, _, rest = dotted.partition(".")
    if rest:
        inner = target.setdefault(head, {})
        if not isinstance(inner, dict):
            inner = {}
            target[head] = inner
        put_setting(inner, rest, value)
    else:
        target[head] = value


NESTED_SECTIONS = ("timeouts", "jobs", "autostop", "tls")
"""Sections whose fields are set one by one (file lines, flags `jobs.run_as=...`)."""


def flatten_settings(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`data` by setting name: the fields of NESTED_SECTIONS as dotted names."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key in NESTED_SECTIONS and isinstance(value, Mapping) and not prefix:
            flat.update(flatten_settings(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def source_of(loc: tuple[str, ...], sources: Mapping[str, str], message: str = "") -> str:
    """Where the value at `loc` came from. An error of a whole section (the timeout ordering)
    names the sources of the section's values that its message mentions."""
    for depth in range(len(loc), 0, -1):
        name = ".".join(loc[:depth])
        if name in sources:
            return sources[name]
    prefix = ".".join(loc) + "." if loc else ""
    inside = {k: v for k, v in sources.items() if k.startswith(prefix) and prefix}
    named = [v for k, v in inside.items() if k.rsplit(".", 1)[-1] in message]
    named = named or list(inside.values())
    if named:
        kinds = {v.split(":", 1)[0] for v in named}
        if kinds == {"file"}:
            return "file:" + ", ".join(v.removeprefix("file:") for v in named)
        return named[0]
    return "default"
