"""The JSON files of a job's directory (node.jobs.supervise writes and reads them) as TypedDicts,
and the checked reading of the two the daemon acts on: `supervisor.json` and `result.json`.

supervise.py is standard library only and runs as a script: it names these types for mypy only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from node.jobs.filetypes import JobResultJson, StartedJson
from node.jobs.supervise import read_json

log = logging.getLogger(__name__)


def _check(data: Mapping[str, object], name: str, kinds: tuple[type, ...], file: str) -> None:
    value = data.get(name)
    if isinstance(value, bool) and bool not in kinds:
        raise ValueError(f"{file}: {name} is {value!r}")
    if not isinstance(value, kinds):
        raise ValueError(f"{file}: {name} is {value!r}")


_NUMBER_OR_NONE = (int, float, type(None))
_INT_OR_NONE = (int, type(None))
_TEXT_OR_NONE = (str, type(None))


def result_from_json(data: object) -> JobResultJson:
    """A `result.json` document, checked field by field; ValueError names the field."""
    if not isinstance(data, dict):
        raise ValueError(f"result.json is not a JSON object: {data!r}")
    for name, kinds in (
        ("state", (str,)),
        ("exit_code", _INT_OR_NONE),
        ("signal", _TEXT_OR_NONE),
        ("reason", _TEXT_OR_NONE),
        ("started_at", _NUMBER_OR_NONE),
        ("ended_at", (int, float)),
    ):
        _check(data, name, kinds, "result.json")
    capped = data.get("log_capped")
    if capped is not None and not isinstance(capped, dict):
        raise ValueError(f"result.json: log_capped is {capped!r}")
    return cast(JobResultJson, data)


def started_from_json(data: object) -> StartedJson:
    """A `supervisor.json` document, checked field by field; ValueError names the field."""
    if not isinstance(data, dict):
        raise ValueError(f"supervisor.json is not a JSON object: {data!r}")
    for name, kinds in (("started_at", _NUMBER_OR_NONE), ("pid", _INT_OR_NONE)):
        _check(data, name, kinds, "supervisor.json")
    if "start_ticks" in data:
        _check(data, "start_ticks", _INT_OR_NONE, "supervisor.json")
    return cast(StartedJson, data)


def read_result(path: Path) -> JobResultJson | None:
    """The job's `result.json` (None: absent). A malformed one is a lost job's result whose
    reason names the malformed field: the end happened, its status is unknown."""
    data = read_json(path)
    if data is None:
        return None
    try:
        return result_from_json(data)
    except ValueError as exc:
        log.warning("jobs: %s is malformed: %s", path, exc)
        return {
            "state": "lost",
            "exit_code": None,
            "signal": None,
            "reason": f"exit status unreadable: {exc}",
            "started_at": None,
            "ended_at": time.time(),
        }


def read_started(path: Path) -> StartedJson | None:
    """The job's `supervisor.json` (None: absent: not started). A malformed one says the job
    started and nothing more (no pid: nothing is ever signalled by it)."""
    data = read_json(path)
    if data is None:
        return None
    try:
        return started_from_json(data)
    except ValueError as exc:
        log.warning("jobs: %s is malformed: %s", path, exc)
        return {"started_at": None, "pid": None}
