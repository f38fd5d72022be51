"""Files only their owner may read (the cluster secret, TLS keys, tokens): the one mode check,
light enough for any command (only `stat`)."""

from __future__ import annotations

import stat
from pathlib import Path


def shared_file_problem(path: Path, mode: int, what: str) -> str | None:
    """Why a private file (a secret, a key) of `mode` must not be used: readable by group or
    others, with the chmod that fixes it; None when it is private."""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return (
            f"{path}: {what} is readable by group or others (mode {stat.S_IMODE(mode):o}); "
            f"run: chmod 600 {path}"
        )
    return None
