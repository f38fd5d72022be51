"""Reading YAML files with line numbers, and turning pydantic errors into one clear line each.
PyYAML is imported when a file is read, so settings without a file never load it."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from config.errors import ConfigError

if TYPE_CHECKING:
    import yaml

_MESSAGES: dict[str, str] = {
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "list_type": "must be a list",
    "missing": "is required",
    "enum": "must be one of",
    "literal_error": "must be one of",
}


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML mapping and the line of every key path in it."""

    path: Path
    data: dict[str, Any]
    lines: Mapping[tuple[str, ...], int]

    def line_of(self, loc: Sequence[str | int]) -> int | None:
        """The 1-based line of the deepest key of `loc` that exists in the file."""
        keys = tuple(str(part) for part in loc)
        while keys:
            if keys in self.lines:
                return self.lines[keys]
            keys = keys[:-1]
        return None

    def where(self, loc: Sequence[str | int]) -> str:
        line = self.line_of(loc)
        return f"{self.path}:{line}" if line is not None else str(self.path)


def _index_lines(node: yaml.Node, prefix: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    import yaml

    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (*prefix, str(key_node.value))
            out[key] = key_node.start_mark.line + 1
            _index_lines(value_node, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            key = (*prefix, str(index))
            out[key] = item.start_mark.line + 1
            _index_lines(item, key, out)


def load_yaml_mapping(path: Path, what: str) -> YamlDocument:
    """Read `path` as a YAML mapping; errors name the file, line and column."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: {what} not found") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc}") from exc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML syntax error: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: {what} must be a YAML mapping, got {type(data).__name__}")
    lines: dict[tuple[str, ...], int] = {}
    if node is not None:
        _index_lines(node, (), lines)
    return YamlDocument(path=path, data=data, lines=lines)


def _unwrap(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else annotation
    return annotation


def _known_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names valid at `loc` (the parent of an unknown key), walking models and dicts."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        elif typing.get_origin(current) in (dict, Mapping):
            current = typing.get_args(current)[1]
        elif typing.get_origin(current) in (list, Sequence, tuple):
            current = typing.get_args(current)[0]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def describe_error(model: type[BaseModel], error: Mapping[str, Any]) -> str:
    """One line for one pydantic error: `field.path: what is wrong, got X`."""
    loc = [str(part) for part in error.get("loc", ())]
    field = ".".join(loc) if loc else "(top level)"
    kind = str(error.get("type", ""))
    value = error.get("input")
    if kind == "extra_forbidden":
        known = _known_keys(model, loc[:-1])
        hint = difflib.get_close_matches(loc[-1], known, n=1) if loc else []
        suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
        allowed = f" (known keys: {', '.join(sorted(known))})" if known and not hint else ""
        return f"{field}: unknown key{suggestion}{allowed}"
    message = str(error.get("msg", "is invalid"))
    if message.startswith("Value error, "):
        return f"{field}: {message.removeprefix('Value error, ')}"
    if kind in ("enum", "literal_error"):
        expected = error.get("ctx", {}).get("expected", "")
        return f"{field}: must be one of {expected}, got {value!r}"
    base = _MESSAGES.get(kind)
    if base is None:
        base = message[0].lower() + message[1:] if message else "is invalid"
    if kind == "missing":
        return f"{field}: {base}"
    return f"{field}: {base}, got {value!r}"


def validation_problems(
    model: type[BaseModel], exc: ValidationError, doc: YamlDocument | None, prefix: str = ""
) -> list[str]:
    """Every error of `exc` as `file:line: field: message` (or `prefix: field: message`)."""
    problems = []
    for error in exc.errors():
        line = describe_error(model, error)
        if doc is not None:
            problems.append(f"{doc.where(error.get('loc', ()))}: {line}")
        elif prefix:
            problems.append(f"{prefix}: {line}")
        else:
            problems.append(line)
    return problems
