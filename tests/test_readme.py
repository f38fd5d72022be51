"""The README's Python blocks compile, and every `shoal.X` and `session.X` they use exists with
a signature that takes the arguments the block passes."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shoal

ROOT = Path(__file__).resolve().parents[1]
OBJECTS: dict[str, Any] = {"shoal": shoal, "session": shoal.TrainingSession}
"""What each name of the README's blocks stands for."""


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def problems(source: str) -> list[str]:
    """What in `source` names a missing attribute of shoal or a session, or calls one with
    arguments its signature refuses."""
    found: list[str] = []
    for item in ast.walk(ast.parse(source)):
        if not isinstance(item, ast.Attribute) or not isinstance(item.value, ast.Name):
            continue
        owner = OBJECTS.get(item.value.id)
        if owner is None:
            continue
        if not hasattr(owner, item.attr):
            found.append(f"{item.value.id}.{item.attr} does not exist")
    for item in ast.walk(ast.parse(source)):
        if isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute):
            func = item.func
            if isinstance(func.value, ast.Name) and func.value.id in OBJECTS:
                target = getattr(OBJECTS[func.value.id], func.attr, None)
                if callable(target):
                    found.extend(_refused(target, item, f"{func.value.id}.{func.attr}"))
    return found


def _refused(target: Callable[..., Any], call: ast.Call, name: str) -> list[str]:
    signature = inspect.signature(target)
    is_method = "self" in signature.parameters
    args = [None] * (len(call.args) + (1 if is_method else 0))
    kwargs = {keyword.arg: None for keyword in call.keywords if keyword.arg is not None}
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return [f"{name}(...) does not fit its signature: {exc}"]
    return []


def test_the_readme_shows_the_training_loop() -> None:
    blocks = python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert any("shoal.training_session()" in block for block in blocks)
    for block in blocks:
        compile(block, "README.md", "exec")
        assert not problems(block), problems(block)


def test_the_check_sees_a_wrong_name_and_a_wrong_call() -> None:
    source = (
        "with shoal.training_session() as session:\n"
        "    session.checkpoint(state)\n"
        "    session.save(state, step, 3)\n"
        "    session.report(step, loss=1.0)\n"
    )
    assert problems(source) == [
        "session.checkpoint does not exist",
        "session.save(...) does not fit its signature: too many positional arguments",
    ]
