"""One way to build a component (issue 35, item 2): NodeRuntime is no service locator, its
handles are given when it is built, and the daemon does not hang parts on it afterwards. The
fields still filled after construction, and the parts node/daemon.py still opens itself, are
listed here with their reason, counted and printed; the lists may only shrink."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from node.runtime import NodeRuntime

ROOT = Path(__file__).resolve().parents[2]
DAEMON = ROOT / "node" / "daemon.py"

LATE_FIELDS = {
    "port": "the port the API listens on, known once its site is bound (port 0: any)",
    "membership": "opened after the API serves, on the API's port number",
    "jobs": "the job counts, set by the job component when it opens",
    "autostop": "the auto-stop status, set once auto-stop opens after membership",
    "training": "the training summary, set by the training component when it opens",
}
"""Handle fields a part assigns after the runtime is built (`runtime.FIELD = ...`)."""

LIVE_FIELDS = frozenset({"role", "term", "coordinator", "plan_version", "drain", "quarantine"})
"""The node's live state (None: not known yet), written by the election and the quarantine
each time status is read: state, not a handle."""

OPENED_BY_DAEMON = {
    "WriteAheadLog": "the WAL, first: everything durable writes to it",
    "open_health": "health and the GPU reader (node.boot), before the runtime they are given to",
    "AppRunner": "the HTTP server of the served components' routes",
    "UdpMembershipTransport": "membership's transport, on the API's bound port",
    "Membership": "membership, once the API serves",
    "open_discovery": "discovery, feeding membership",
    "open_autostop": "auto-stop, over the jobs and locks",
}
"""What node/daemon.py constructs or opens itself rather than from the served list."""

MAX_HAND_ENTERED = 8
"""Places node/daemon.py puts something on its exit stack itself, beside `enter(stack, the
served list)`: the WAL, health (with the GPU reader), the HTTP runner, the dashboard's streams
(closed before the runner), membership, the election, discovery and auto-stop."""

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
    unlisted = {name: where for name, where in late.items() if name not in LATE_FIELDS}
    assert not unlisted, (
        f"give these to NodeRuntime(...) or to the part that reads them: {unlisted}"
    )
    gone = sorted(set(LATE_FIELDS) - set(late))
    assert not gone, f"no longer assigned late: drop {gone} from LATE_FIELDS"


def test_the_daemon_opens_only_the_listed_parts_itself() -> None:
    called = _called_names(DAEMON)
    opened = sorted(name for name in OPENED_BY_DAEMON if name in called)
    lines = len(DAEMON.read_text(encoding="utf-8").splitlines())
    print(f"node/daemon.py: {lines} lines, opens {len(opened)} parts itself: {', '.join(opened)}")
    entered = _hand_entered(DAEMON)
    print(f"node/daemon.py puts {len(entered)} parts on its stack by hand:", *entered, sep="\n  ")
    assert len(entered) <= MAX_HAND_ENTERED, "a new part belongs in node.parts' one list"
    gone = sorted(set(OPENED_BY_DAEMON) - set(opened))
    assert not gone, f"node/daemon.py no longer opens these: drop {gone} from OPENED_BY_DAEMON"
    for name in ("Served", "api_identity", "CrlSpread", "CrlComponent"):
        assert name not in called, f"node/daemon.py builds {name}: it belongs in node.parts' list"
    source = DAEMON.read_text(encoding="utf-8")
    assert "components = (*" not in source, "a component is appended after the one list"
