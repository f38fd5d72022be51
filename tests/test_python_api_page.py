"""docs/python-api.md stays true: every name its tables give is exported, the seed's names each
have their row, and the `shoal` section renders (mkdocstrings) exactly `shoal.__all__`, each
name with a docstring of its own."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import griffe
import yaml

import shoal

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "python-api.md"
SEED_NAMES = (
    "get_host_breaker",
    "load_remote_hosts",
    "get_pending_entries",
    "get_health_summary",
    "detect_storage_provider",
    "get_storage_provider",
    "get_unified_wal",
    "get_eligible_hosts_for_board",
    "detect_host_memory",
)
"""Names of the seed's API a user looks up first (the seed's docs; the issue that lost them)."""


def _resolve(dotted: str) -> None:
    """Import the longest module prefix of `dotted`; the next part must be in its `__all__`
    and any further parts attributes of that name."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        name, *attributes = parts[split:]
        assert name in module.__all__, f"docs/python-api.md names {dotted}: {name} not exported"
        target = getattr(module, name)
        for attribute in attributes:
            assert hasattr(target, attribute), f"docs/python-api.md names {dotted}: no {attribute}"
            target = getattr(target, attribute)
        return
    raise AssertionError(f"docs/python-api.md names {dotted}, which is no importable package")


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def test_python_api_page_names_exist() -> None:
    """Every name in the first column of the internal packages' tables is exported."""
    named = re.findall(r"^\| `((?:config|wal|health|sync|node)\.[A-Za-z_.]+)` \|", _page(), re.M)
    assert len(named) >= 40
    for dotted in named:
        _resolve(dotted)


def seed_rows(page: str) -> list[tuple[str, str]]:
    """(seed column, shoal column) of each row of the page's seed table."""
    section = page.split("## From the seed's API", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (`[^`]+`|none) \| .+ \|$", section, re.M)
    return [(seed, shoal_name.strip("`")) for seed, shoal_name in rows]


def test_each_seed_name_has_its_shoal_equivalent() -> None:
    rows = seed_rows(_page())
    seeds = " ".join(seed for seed, _ in rows)
    missing = [name for name in SEED_NAMES if not re.search(rf"[`.]{name}\(", seeds)]
    assert not missing, f"docs/python-api.md's seed table lacks {missing}"
    for _, dotted in rows:
        if dotted != "none":
            _resolve(dotted)


def shoal_members(page: str) -> list[str]:
    """The names the page's `::: shoal` block renders (its `members` option)."""
    block = page.split("::: shoal\n", 1)[1].split("\n\n", 1)[0]
    options = yaml.safe_load(block)["options"]
    return list(options["members"])


def test_the_shoal_section_renders_every_public_name() -> None:
    members = shoal_members(_page())
    assert sorted(members) == sorted(shoal.__all__), (
        "docs/python-api.md's `::: shoal` members differ from shoal.__all__: add the missing "
        "names to its members list"
    )
    package = griffe.load("shoal", search_paths=[str(ROOT)])
    for name in members:
        own = getattr(shoal, name).__doc__ or ""
        assert own.strip(), f"shoal.{name} has no docstring of its own"
        assert package[name].docstring is not None, f"mkdocstrings cannot read shoal.{name}"


def test_the_member_check_sees_a_missing_name() -> None:
    page = "x\n::: shoal\n    options:\n      members:\n        - TrainingSession\n\n## next\n"
    assert shoal_members(page) == ["TrainingSession"]
    assert sorted(shoal_members(page)) != sorted(shoal.__all__)
