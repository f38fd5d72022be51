"""`python -m node serve ...` with one crash armed at a run's job-start step.

usage: crash_daemon.py --crash-at POINT --marker FILE [serve arguments ...]

POINT is `before_job_post` (the run's `starting` step is stored; the job is not asked for yet)
or `after_job_post` (the job API answered that the job started; the `running` step is not
stored yet). The first daemon of the cluster to reach POINT (it coordinates: only the
coordinator drives runs) creates FILE holding its node id and SIGKILLs itself; FILE existing
disarms every daemon, so a restarted one runs normally. The seam is the RunService class,
wrapped in this process only: the daemon's code is unchanged.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from node.cli import main as shoal_main
from node.runs.queue import RunRecord, RunStep
from node.runs.service import RunService

POINTS = ("before_job_post", "after_job_post")


def _crash_once(marker: Path, node_id: str) -> None:
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, node_id.encode())
    os.fsync(fd)
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, marker: Path) -> None:
    """Wrap RunService so this process dies at `point` (once across the cluster)."""
    start_job = RunService._start_job
    put = RunService._put

    async def start_job_then_crash(self: RunService, run: RunRecord) -> None:
        if point == "before_job_post":
            _crash_once(marker, self.locks.runtime.node_id)
        await start_job(self, run)

    async def put_or_crash(self: RunService, record: RunRecord) -> None:
        if point == "after_job_post" and record.step is RunStep.RUNNING:
            _crash_once(marker, self.locks.runtime.node_id)
        await put(self, record)

    RunService._start_job = start_job_then_crash  # type: ignore[method-assign]
    RunService._put = put_or_crash  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crash-at", choices=POINTS, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    args, serve = parser.parse_known_args(argv)
    arm(args.crash_at, args.marker)
    sys.argv = [sys.argv[0], *serve]
    shoal_main()


if __name__ == "__main__":
    main(sys.argv[1:])
