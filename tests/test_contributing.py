"""CONTRIBUTING.md stays true: every file or folder it names exists, every `make` target it
names is a target of the Makefile, and every dotted name of shoal's packages it gives imports."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "CONTRIBUTING.md"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
PATH_SUFFIXES = (".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".txt", ".json")
PACKAGES = ("config", "net", "wal", "health", "sync", "node", "shoal")


def named(text: str) -> tuple[set[str], set[str], set[str]]:
    """(paths, make targets, dotted names) that `text` names: paths and dotted names in inline
    code outside fenced blocks, targets in inline `make X` and in fenced lines starting with
    `make`. A `<placeholder>` and a bare module name (`routes.py`: a role) are skipped."""
    prose = FENCE.sub("", text)
    spans = re.findall(r"`([^`\n]+)`", prose)
    commands = [*spans, *(line for block in FENCE.findall(text) for line in block.splitlines())]
    targets = {match[1] for line in commands if (match := re.match(r"make ([\w./-]+)", line))}
    paths: set[str] = set()
    dotted: set[str] = set()
    for span in spans:
        if "<" in span or " " in span or span.startswith(("/", "make")):
            continue
        if "/" in span or span == "Makefile" or span.endswith(PATH_SUFFIXES[1:]):
            paths.add(span)
        elif re.fullmatch(r"[a-z_]+(\.[A-Za-z_]+)+", span) and span.split(".")[0] in PACKAGES:
            dotted.add(span)
    return paths, targets, dotted


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_every_path_the_guide_names_exists() -> None:
    paths, _, _ = named(GUIDE.read_text(encoding="utf-8"))
    assert {"node/parts.py", "tests/test_floors.py", "mkdocs.yml"} <= paths
    missing = sorted(path for path in paths if not (ROOT / path).exists())
    assert not missing, f"CONTRIBUTING.md names paths that do not exist: {missing}"


def test_every_make_target_the_guide_names_exists() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    _, targets, _ = named(GUIDE.read_text(encoding="utf-8"))
    assert {"test", "check", "docs", "run"} <= targets
    unknown = []
    for target in sorted(targets):
        dry = subprocess.run(
            ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
        if dry.returncode != 0:
            unknown.append(f"{target}: {dry.stderr.strip()}")
    assert not unknown, f"CONTRIBUTING.md names make targets the Makefile lacks: {unknown}"


def test_every_dotted_name_the_guide_gives_imports() -> None:
    _, _, dotted = named(GUIDE.read_text(encoding="utf-8"))
    assert "config.declare.READ" in dotted
    missing = sorted(name for name in dotted if not _resolves(name))
    assert not missing, f"CONTRIBUTING.md gives names that do not exist: {missing}"


def test_the_guide_check_sees_what_is_missing() -> None:
    text = "`node/nope.py` and `make nope` and `node.nope.thing`, not `node/<x>/`\n"
    paths, targets, dotted = named(text)
    assert (paths, targets, dotted) == ({"node/nope.py"}, {"nope"}, {"node.nope.thing"})
    assert not _resolves("node.nope.thing")
    assert _resolves("config.declare.route")
