"""Floors inside `node/`: the same one-way rule as the top-level layers, one level down. A module
of a floor imports only from its own floor or the floors below it; the test names every import
that climbs (file, line, the module it imports and both floors)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "node"

FLOORS: list[tuple[str, ...]] = [
    # the base: errors, the runtime handle, addresses, signing, OpenAPI, the plan and its fence,
    # the core routes, logs, metrics, systemd, start-up errors, the audit read from the WAL, the
    # component protocol, TLS identities and roles
    (
        "errors",
        "runtime",
        "addresses",
        "security",
        "access",
        "openapi",
        "plan",
        "fence",
        "routes",
        "logs",
        "metrics",
        "systemd",
        "startup",
        "audit",
        "component",
        "identity",
        "limits",
        "connections",
        "signers",
        "forwarding",
    ),
    ("membership", "discovery", "keyring"),
    ("election", "training"),
    ("locks",),
    ("ssh", "providers", "jobs", "quarantine"),
    ("runs", "rl", "workers", "sync_service", "sync_routes", "backup", "records", "checkpoints"),
    ("tasks",),
    ("ui",),
    ("daemon", "boot", "parts", "assembly", "lifecycle"),
    ("cli", "__main__"),
]
"""Bottom to top. `node/__init__.py` (lazy re-exports of every floor) stands outside them."""

FLOOR_OF = {name: index for index, names in enumerate(FLOORS) for name in names}


def _unit(module: str) -> str | None:
    """`node.jobs.gang` -> `jobs`; `node.plan` -> `plan`; `node` itself -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "node" and len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for item in ast.walk(tree):
        if isinstance(item, ast.Import):
            found.extend((item.lineno, alias.name) for alias in item.names)
        elif isinstance(item, ast.ImportFrom) and item.level == 0 and item.module:
            if item.module == "node":
                found.extend((item.lineno, f"node.{alias.name}") for alias in item.names)
            else:
                found.append((item.lineno, item.module))
    return found


def _source_unit(path: Path) -> str:
    relative = path.relative_to(NODE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def test_every_node_module_and_package_has_a_floor() -> None:
    units = {_source_unit(path) for path in NODE.rglob("*.py")} - {"__init__"}
    unplaced = sorted(units - set(FLOOR_OF))
    assert not unplaced, f"give these node/ modules or packages a floor in FLOORS: {unplaced}"
    gone = sorted(set(FLOOR_OF) - units)
    assert not gone, f"FLOORS names what node/ no longer has: {gone}"


def test_no_import_climbs_a_floor() -> None:
    offenders = []
    for path in sorted(NODE.rglob("*.py")):
        if path == NODE / "__init__.py":
            continue
        source = _source_unit(path)
        for line, module in _imports(path):
            target = _unit(module)
            if target is None or target == source or target not in FLOOR_OF:
                continue
            if FLOOR_OF[target] > FLOOR_OF[source]:
                offenders.append(
                    f"{path.relative_to(ROOT)}:{line} imports {module} "
                    f"(floor {FLOOR_OF[target]} {target!r} is above floor "
                    f"{FLOOR_OF[source]} {source!r})"
                )
    assert not offenders, "imports climb node/'s floors:\n" + "\n".join(offenders)


def test_the_floor_check_sees_a_climbing_import(tmp_path: Path) -> None:
    """The check itself: an import of the daemon from the plan is a climb."""
    module = tmp_path / "plan.py"
    module.write_text("from node.daemon import NodeDaemon\n", encoding="utf-8")
    [(line, imported)] = _imports(module)
    assert (line, imported) == (1, "node.daemon")
    assert FLOOR_OF[_unit(imported) or ""] > FLOOR_OF["plan"]


def test_node_modules_follow_the_package_convention() -> None:
    """A node/ package names its modules by role (`routes.py`, `service.py`, `component.py`,
    `client.py`: docs/layout.md); a vague `api.py` says none of them."""
    vague = sorted(str(path.relative_to(ROOT)) for path in NODE.rglob("api.py"))
    assert not vague, f"name these by their role (routes, service, component, client): {vague}"
