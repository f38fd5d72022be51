"""Which step directories a node deletes: committed steps beyond the newest `checkpoint_keep`,
and steps some rank never finished; the newest committed step never. The decision is a pure
function of the directories, their ages and the committed log; `sweep` does the deleting.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from node.locks.checkpoints import CheckpointLog, parse_step_directory

log = logging.getLogger(__name__)

STALE_S = 3600.0
"""An uncommitted step above the newest committed one is a write in progress until nothing in
it changed for this long."""


def doomed(
    ages_s: Mapping[str, float], committed: CheckpointLog, keep: int, stale_s: float = STALE_S
) -> list[str]:
    """The step directories (names of `ages_s`, seconds since anything in each changed) to
    delete, given the cluster's committed `log` and the `keep` newest committed steps to keep:

    - the newest `keep` committed steps stay (the newest always);
    - any other step at or below the newest committed one goes (older committed, or never
      committed: a step some rank did not finish, or an older generation's);
    - a step above it stays while it may still be written, and goes once stale (`stale_s`).

    Names that are not step directories are never touched."""
    kept = {record.directory for record in committed.committed[-max(1, keep) :]}
    newest = committed.newest
    out = []
    for name, age_s in sorted(ages_s.items()):
        parsed = parse_step_directory(name)
        if parsed is None or name in kept:
            continue
        step, _ = parsed
        if (newest is not None and step <= newest.step) or age_s > stale_s:
            out.append(name)
    return out


def directory_ages(root: Path, now: float | None = None) -> dict[str, float]:
    """Seconds since anything in each step directory of `root` changed (its newest mtime).
    Blocking."""
    now = time.time() if now is None else now
    ages: dict[str, float] = {}
    try:
        with os.scandir(root) as listing:
            entries = list(listing)
    except FileNotFoundError:
        return ages
    for entry in entries:
        if parse_step_directory(entry.name) is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:  # each listing closed even when a file or the directory goes away under it
            newest = entry.stat(follow_symlinks=False).st_mtime
            with os.scandir(entry.path) as items:
                for item in items:
                    newest = max(newest, item.stat(follow_symlinks=False).st_mtime)
        except OSError:
            continue  # a directory going away: judged at the next sweep
        ages[entry.name] = max(0.0, now - newest)
    return ages


def sweep(root: Path, committed: CheckpointLog, keep: int, stale_s: float = STALE_S) -> list[str]:
    """Delete the doomed step directories of `root`; their names. Blocking."""
    names = doomed(directory_ages(root), committed, keep, stale_s)
    for name in names:
        shutil.rmtree(root / name, ignore_errors=True)
    if names:
        log.info("checkpoints: deleted %s", ", ".join(names))
    return names
