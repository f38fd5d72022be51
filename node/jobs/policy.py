"""Who may run what: the program allowlist, the user jobs run as, and a job's environment."""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from config import ConfigError, JobSettings
from node.errors import JobError, LauncherError, RendezvousError
from node.jobs.filetypes import RunAsJson
from node.jobs.records import JobRequest
from node.training.rendezvous import Rendezvous
from node.training.torchrun import node_place, torchrun_env


@dataclass(frozen=True)
class RunAs:
    """The user jobs run as (only when the daemon is root and `jobs.run_as` is set)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def to_launch(self) -> RunAsJson:
        return {"uid": self.uid, "gid": self.gid, "groups": list(self.groups)}


def resolve_run_as(settings: JobSettings, euid: int | None = None) -> RunAs | None:
    """The configured `jobs.run_as` user when the daemon is root, else None (jobs run as the
    daemon's user). ConfigError names a user that does not exist."""
    euid = os.geteuid() if euid is None else euid
    if settings.run_as is None or euid != 0:
        return None
    try:
        entry = pwd.getpwnam(settings.run_as)
    except KeyError as exc:
        raise ConfigError(
            f"jobs.run_as: there is no user {settings.run_as!r} on this host; create it or "
            "remove the setting"
        ) from exc
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def resolve_program(settings: JobSettings, argv0: str) -> str | None:
    """The executable to run for `argv0` under the allowlist, or None when any program may run
    (then the job's own PATH finds it). JobError(403) when the program is not allowed.

    An allowed bare name is found on the daemon's PATH, never the job's, so a job's `env`
    cannot swap in another program of the same name.
    """
    allowed = settings.allowed_programs
    if allowed is None:
        return None
    if "/" in argv0:
        path = os.path.abspath(argv0)
        if path in allowed or argv0 in allowed:
            return path
    else:
        found = shutil.which(argv0)
        if found is not None and (argv0 in allowed or found in allowed):
            return found
    raise JobError(
        403,
        "program_not_allowed",
        f"program {argv0!r} is not in jobs.allowed_programs of this node "
        f"({', '.join(allowed) or 'empty'}); ask its operator to allow it",
    )


def job_env(
    request: JobRequest,
    *,
    base: Mapping[str, str],
    rendezvous: Mapping[str, str],
    shoal: Mapping[str, str],
    run_as: RunAs | None,
) -> dict[str, str]:
    """The job's environment: the daemon's, the request's `env`, the rendezvous (when asked
    for), then SHOAL_JOB_ID, SHOAL_DAEMON_URL and gang variables, which nothing overrides."""
    env = {k: v for k, v in base.items() if not k.startswith("NOTIFY_SOCKET")}
    if run_as is not None:
        env.update(HOME=run_as.home, USER=run_as.name, LOGNAME=run_as.name)
    env.update(request.env)
    env.update(rendezvous)
    env.update(shoal)
    return env


def rendezvous_env(
    document: Mapping[str, Any] | None, inherited: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The torchrun variables (`torchrun_env`) of this node's rendezvous document
    (GET /v1/rendezvous) for local rank 0, or for the LOCAL_RANK the job's environment
    `inherited` sets; empty when the node has no training rank. JobError(400) when that
    LOCAL_RANK is not one of this node's local ranks."""
    inherited = {} if inherited is None else inherited
    if document is None:
        return {}
    try:
        rendezvous = Rendezvous.from_dict(document)
        place = node_place(rendezvous)
    except (RendezvousError, LauncherError):
        return {}
    wanted = inherited.get("LOCAL_RANK", "0")
    if not (wanted.isascii() and wanted.isdigit()) or int(wanted) >= place.local_world_size:
        raise JobError(
            400,
            "bad_local_rank",
            f"the job's LOCAL_RANK {wanted!r} is not a local rank of this node (0 to "
            f"{place.local_world_size - 1}); drop it or pick one of those",
        )
    return torchrun_env(rendezvous, local_rank=int(wanted), inherited=inherited)
