"""One way to build a component (issue 35, item 2): NodeRuntime is no service locator, its
handles are given when it is built and no part hangs one on it afterwards (only its live state
changes), and node/daemon.py builds no part itself: it enters node.assembly's one list."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from node.runtime import NodeRuntime

ROOT = Path(__file__).resolve().parents[2]
DAEMON = ROOT / "node" / "daemon.py"

LIVE_FIELDS = frozenset({"role", "term", "coordinator", "plan_version", "drain", "quarantine"})
"""The node's live state (None: not known yet), written by the election and the quarantine
each time status is read: state, not a handle."""

OPENERS = frozenset(
    {
        "WriteAheadLog",
        "host_health",
        "AppRunner",
        "UdpMembershipTransport",
        "Membership",
        "DiscoveryPart",
        "AutostopPart",
        "ElectionService",
        "served_parts",
    }
)
"""Parts node.assembly builds into the one list: node/daemon.py builds none of them itself."""

STACK_CALLS = frozenset({"enter_async_context", "push_async_callback", "callback"})


def _assigned_runtime_fields() -> dict[str, list[str]]:
    """`field -> [path:line]` for each `<...runtime>.field = ...` in node/."""
    fields = {f.name for f in dataclasses.fields(NodeRuntime)}
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "node").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if (
                        isinstance(each, ast.Attribute)
                        and each.attr in fields
                        and "runtime" in ast.unparse(each.value)
                    ):
                        where = f"{path.relative_to(ROOT)}:{node.lineno}"
                        found.setdefault(each.attr, []).append(where)
    return found


def _called_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute):
                names.add(func.attr)
    return names


def _hand_entered(path: Path) -> list[str]:
    """`line: call` for each call that puts a part on the daemon's exit stack by hand (a stack
    method, or the stack passed to an opener), `enter` of the one list excepted."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        passes_stack = any(ast.unparse(arg) == "self._stack" for arg in node.args)
        if name == "enter":
            continue
        if (name in STACK_CALLS and "_stack" in ast.unparse(func)) or passes_stack:
            found.append(f"{node.lineno}: {ast.unparse(node)[:60]}")
    return sorted(found)


def test_the_runtime_is_no_service_locator() -> None:
    hints = typing.get_type_hints(NodeRuntime)
    locators = [
        name
        for name, hint in hints.items()
        if typing.get_origin(hint) is dict and typing.get_args(hint)[:1] == (type,)
    ]
    optional = [name for name, hint in hints.items() if type(None) in typing.get_args(hint)]
    print(
        f"NodeRuntime: {len(hints)} fields, {len(optional)} optional "
        f"({len(LIVE_FIELDS)} live state), {len(locators)} keyed by type"
    )
    assert locators == [], "NodeRuntime keeps no dict[type, ...]: pass the handle when building"


def test_no_part_hangs_a_handle_on_the_runtime_after_it_is_built() -> None:
    assigned = _assigned_runtime_fields()
    late = {name: where for name, where in assigned.items() if name not in LIVE_FIELDS}
    print(f"runtime fields assigned after construction: {len(late)} ({', '.join(sorted(late))})")
    assert not late, f"give these to NodeRuntime(...) or to the part that reads them: {late}"


def test_the_daemon_opens_only_the_one_list() -> None:
    called = _called_names(DAEMON)
    opened = sorted(OPENERS & called)
    lines = len(DAEMON.read_text(encoding="utf-8").splitlines())
    print(f"node/daemon.py: {lines} lines, builds {len(opened)} parts itself: {', '.join(opened)}")
    entered = _hand_entered(DAEMON)
    print(f"node/daemon.py puts {len(entered)} parts on its stack by hand:", *entered, sep="\n  ")
    assert entered == [], "a part belongs in node.assembly's one list, entered with enter()"
    assert opened == [], "node/daemon.py builds no part itself: node.assembly.build_node does"
