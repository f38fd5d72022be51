"""Training processes (`groups_netns_worker.py`) beside netns shoal daemons, and their events.

`Trainers` starts one worker in each daemon's namespace against that daemon's own address,
reads the JSON lines the workers print as they grow, and waits for conditions on them. Used by
tests/node/test_groups_netns.py and bench/election_bench.py.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import ClusterProcess, Host, WaitTimeoutError
from tests.node.netns_swarm import Swarm

__all__ = ["TRAINING_SETTINGS", "Trainers", "WorkerEvent"]

WORKER = Path(__file__).with_name("groups_netns_worker.py")
ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.02
COLLECTIVE_S = 5.0
"""The workers' collective timeout: above failure detection (4.4 s with default timeouts)."""

TRAINING_SETTINGS: Mapping[str, object] = {
    "role": "training",
    "backend": "gloo",
    "min_training": 1,
}
"""Config file settings of a daemon whose host trains on the CPU."""


@dataclass(frozen=True)
class WorkerEvent:
    """One line of a worker: `event` is joined, reduced, failed or regroup_failed."""

    host: str
    event: str
    t: float
    pid: int
    generation: int | None = None
    rank: int | None = None
    world_size: int | None = None
    value: float | None = None
    error: str | None = None


class Trainers:
    """One training process per host of `swarm`, each asking its own daemon for its rank."""

    def __init__(self, swarm: Swarm, collective_s: float = COLLECTIVE_S) -> None:
        self.swarm = swarm
        self.collective_s = collective_s
        self.procs: dict[str, ClusterProcess] = {}
        self.killed: set[str] = set()
        self.events: dict[str, list[WorkerEvent]] = {}
        self._offsets: dict[str, tuple[Path, int, bytes]] = {}

    def start(self, host: Host) -> ClusterProcess:
        argv = [
            sys.executable, str(WORKER),
            f"http://{host.endpoint}", str(self.swarm.secret_file), str(self.collective_s),
        ]  # fmt: skip
        # No GLOO_SOCKET_IFNAME: node/groups.py binds gloo to the interface that routes to the
        # master (the hostname resolves to 127.0.0.1 here, which would break the mesh).
        # CPU trainers: with CUDA hidden, the hosts' trainers never share (or claim) the one
        # machine's GPU, on CI's CPUs and on a GPU host alike.
        env = {"PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
        proc = host.spawn(argv, cwd=ROOT, env=env, name="trainer")
        self.procs[host.name] = proc
        self.killed.discard(host.name)
        self.events[host.name] = []
        self._offsets[host.name] = (proc.log_path, 0, b"")
        return proc

    def start_all(self, hosts: Iterable[Host] | None = None) -> None:
        for host in self.swarm.hosts if hosts is None else hosts:
            self.start(host)

    def kill(self, name: str) -> None:
        """SIGKILL the training process of host `name` and reap it."""
        self.killed.add(name)
        self.procs[name].kill()

    def check(self) -> None:
        """Raise when a worker or daemon that should run has exited."""
        self.swarm.check_daemons()
        for name, proc in self.procs.items():
            if name not in self.killed and not proc.running():
                raise AssertionError(
                    f"the trainer on {name} exited with {proc.returncode}:\n{proc.log_tail(20)}"
                )

    def read(self) -> list[WorkerEvent]:
        """The events printed since the last read, per worker in order."""
        found = []
        for name, (path, offset, partial) in self._offsets.items():
            try:
                with path.open("rb") as log:
                    log.seek(offset)
                    data = log.read()
            except FileNotFoundError:
                continue
            lines = (partial + data).split(b"\n")
            self._offsets[name] = (path, offset + len(data), lines.pop())
            for line in lines:
                if not line.startswith(b"{"):
                    continue
                record = json.loads(line)
                event = WorkerEvent(
                    host=name,
                    event=record["event"],
                    t=record["t"],
                    pid=record["pid"],
                    generation=record.get("generation"),
                    rank=record.get("rank"),
                    world_size=record.get("world_size"),
                    value=record.get("value"),
                    error=record.get("error"),
                )
                self.events[name].append(event)
                found.append(event)
        return found

    def wait_reduced(
        self,
        names: Iterable[str],
        world_size: int,
        *,
        since: float,
        timeout_s: float,
        count: int = 1,
    ) -> dict[str, WorkerEvent]:
        """The `count`-th all_reduce over `world_size` ranks each of `names` completed at or
        after `since`, once all have one. WaitTimeoutError after `timeout_s` (wall time)."""
        wanted = tuple(names)
        deadline = time.monotonic() + timeout_s
        while True:
            self.read()
            first = {name: self.nth_reduced(name, world_size, since, count) for name in wanted}
            done = {name: event for name, event in first.items() if event is not None}
            if len(done) == len(wanted):
                return done
            if time.monotonic() > deadline:
                raise WaitTimeoutError(
                    f"timed out after {timeout_s:g}s waiting for {wanted} to all_reduce over "
                    f"{world_size} ranks; last events: {self.describe()}"
                )
            self.check()
            time.sleep(POLL_S)

    def nth_reduced(
        self, name: str, world_size: int, since: float, count: int = 1
    ) -> WorkerEvent | None:
        """The `count`-th all_reduce of `name` over `world_size` ranks at or after `since`."""
        found = [
            e
            for e in self.events[name]
            if e.event == "reduced" and e.world_size == world_size and e.t >= since
        ]
        return found[count - 1] if len(found) >= count else None

    def describe(self, last: int = 3) -> str:
        parts = []
        for name, events in sorted(self.events.items()):
            shown = ", ".join(
                f"{e.event}@{e.t:.2f}(gen {e.generation} rank {e.rank}/{e.world_size}"
                + (f" {e.error}" if e.error else "")
                + ")"
                for e in events[-last:]
            )
            parts.append(f"{name}: {shown or 'nothing yet'}")
        return "; ".join(parts)
