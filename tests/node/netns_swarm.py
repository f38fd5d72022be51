"""shoal daemons on a netns cluster, watched by one probe process on a host of its own.

`Swarm` starts, restarts and signals the daemons; a `ProbeWatch` reads the probe's output (see
`netns_probe.py`) incrementally and waits until the daemons' views satisfy a condition, returning
the probe time at which it first held: `ViewWatch` for membership views, `ElectionWatch`
(election_netns_swarm.py) for plans. Used by tests/node/test_daemon_netns.py and
bench/membership_netns.py.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from tests.cluster import ClusterProcess, Host, NetnsCluster, WaitTimeoutError

__all__ = [
    "DaemonExitedError",
    "Observation",
    "ProbeWatch",
    "Split",
    "Swarm",
    "ViewWatch",
    "Views",
    "all_alive",
    "everyone_sees",
    "inventory_yaml",
]

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("netns_probe.py")
POLL_S = 0.02

Views = Mapping[str, "Observation"]
Condition = Callable[[Views], bool]


@dataclass(frozen=True)
class Observation:
    """One answer (or failure to answer) of the daemon on host `host`, at probe time `t`."""

    t: float
    host: str
    members: Mapping[str, tuple[str, int]] | None
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.members is not None

    def state_of(self, node_id: str) -> str | None:
        if self.members is None:
            return None
        found = self.members.get(node_id)
        return None if found is None else found[0]


def all_alive(names: Iterable[str]) -> Condition:
    """Every daemon of `names` answers and shows every one of `names` alive."""
    wanted = tuple(names)

    def check(views: Views) -> bool:
        return all(
            name in views and all(views[name].state_of(other) == "alive" for other in wanted)
            for name in wanted
        )

    return check


def everyone_sees(node_id: str, states: Iterable[str], observers: Iterable[str]) -> Condition:
    """Every daemon of `observers` answers and shows `node_id` in one of `states`."""
    wanted, watching = frozenset(states), tuple(observers)

    def check(views: Views) -> bool:
        return all(name in views and views[name].state_of(node_id) in wanted for name in watching)

    return check


def inventory_yaml(hosts: Sequence[Host], cluster_name: str) -> str:
    """An inventory listing `hosts` by name at their address and port."""
    lines = [f"cluster: {{name: {cluster_name}}}", "hosts:"]
    lines += [f"  {h.name}: {{ssh_host: {h.address}, p2p_port: {h.port}}}" for h in hosts]
    return "\n".join(lines) + "\n"


@dataclass
class Split:
    """A partition as the probe saw it: when each side first saw all of the other side dead
    (probe time), and every sighting of a node dead by a node on its own side (a false death:
    they could reach each other all along).

    Call `watch(watch, since, timeout_s)` right after cutting; it returns when both sides
    have decided.
    """

    sides: tuple[tuple[str, ...], tuple[str, ...]]
    decided_at: dict[int, float] = field(default_factory=dict)
    false_deaths: list[str] = field(default_factory=list)

    def _decided(self, side: int, views: Views) -> bool:
        near, far = self.sides[side], self.sides[1 - side]
        return all(everyone_sees(node, {"dead"}, near)(views) for node in far)

    def watch(self, watch: ViewWatch, *, since: float, timeout_s: float) -> None:
        views: dict[str, Observation] = {}

        def note(observation: Observation) -> None:
            if observation.t < since:
                return
            if observation.members is None:
                views.pop(observation.host, None)
                return
            views[observation.host] = observation
            near = next(side for side in self.sides if observation.host in side)
            for node, (state, _) in observation.members.items():
                if node in near and state == "dead":
                    self.false_deaths.append(
                        f"{observation.host}@{observation.t:.2f} sees {node} dead"
                    )
            for side in (0, 1):
                if side not in self.decided_at and self._decided(side, views):
                    self.decided_at[side] = observation.t

        watch.wait(
            lambda views: self._decided(0, views) and self._decided(1, views),
            since=since,
            timeout_s=timeout_s,
            message=f"each side of the cut {self.sides} to see all of the other side dead",
            on_observation=note,
        )


class DaemonExitedError(AssertionError):
    """A daemon that should be running has exited (a test failure)."""


class ProbeLog:
    """The probe's JSON lines, read as its log grows: (host name, answer) per line."""

    def __init__(self, probe: ClusterProcess, hosts: Sequence[Host]) -> None:
        self._path = probe.log_path
        self._names = {h.endpoint: h.name for h in hosts}
        self._offset = 0
        self._partial = b""

    def records(self) -> list[tuple[str, dict[str, Any]]]:
        """The answers written since the last call, in order, for known hosts."""
        try:
            with self._path.open("rb") as log:
                log.seek(self._offset)
                data = log.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        found = []
        for line in lines:
            if not line.startswith(b"{"):
                continue
            record = json.loads(line)
            host = self._names.get(record["target"])
            if host is not None:
                found.append((host, record))
        return found


class ProbeView(Protocol):
    """What every kind of probe answer has: probe time, host, and whether it answered."""

    @property
    def t(self) -> float: ...

    @property
    def host(self) -> str: ...

    @property
    def answered(self) -> bool: ...


V = TypeVar("V", bound=ProbeView)


class ProbeWatch(Generic[V]):
    """The latest view of every daemon, from the probe's log, read as it grows. Subclasses say
    how one JSON line becomes a view (`parse`) and how a view reads in a message (`describe_view`).
    """

    def __init__(self, probe: ClusterProcess, hosts: Sequence[Host]) -> None:
        self.probe = probe
        self._log = ProbeLog(probe, hosts)
        self.latest: dict[str, V] = {}
        self.matched: dict[str, V] = {}
        """The views that made the last successful `wait` hold (fresher ones may be in latest)."""
        self.first_answer: dict[str, float] = {}
        self.guard: Callable[[], None] | None = None
        """Called on every poll of `wait` and `watch_for`; raises to stop waiting early."""

    def parse(self, host: str, record: Mapping[str, Any]) -> V:
        raise NotImplementedError

    def describe_view(self, view: V) -> str:
        raise NotImplementedError

    def read(self) -> list[V]:
        """The views answered since the last read, in order; updates `latest`."""
        found = []
        for host, record in self._log.records():
            view = self.parse(host, record)
            self.latest[host] = view
            if view.answered:
                self.first_answer.setdefault(host, view.t)
            found.append(view)
        return found

    def wait(
        self,
        condition: Callable[[Mapping[str, V]], bool],
        *,
        since: float,
        timeout_s: float,
        message: str,
        hold_s: float = 0.0,
        on_view: Callable[[V], None] | None = None,
    ) -> float:
        """Wait until `condition` holds over views answered at or after `since`, and keeps
        holding for `hold_s` of probe time. Returns the probe time it began to hold.

        Every view read meanwhile goes to `on_view` (which may raise to fail fast). Raises
        WaitTimeoutError naming `message` and the last views after `timeout_s` (wall time).
        """
        fresh = {name: view for name, view in self.latest.items() if view.t >= since}
        held_since: float | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            for view in self.read():
                if on_view is not None:
                    on_view(view)
                if view.t < since:
                    continue
                fresh[view.host] = view
                if not condition(fresh):
                    held_since = None
                    continue
                held_since = view.t if held_since is None else held_since
                if view.t - held_since >= hold_s:
                    self.matched = dict(fresh)
                    return held_since
            if time.monotonic() > deadline:
                raise WaitTimeoutError(
                    f"timed out after {timeout_s:g}s waiting for {message}; "
                    f"last views: {self.describe()}"
                )
            self._check()
            time.sleep(POLL_S)

    def watch_for(self, duration_s: float, on_view: Callable[[V], None] | None = None) -> list[V]:
        """Pass every view of the next `duration_s` to `on_view`; return them."""
        seen: list[V] = []
        end = time.monotonic() + duration_s
        while True:
            for view in self.read():
                if on_view is not None:
                    on_view(view)
                seen.append(view)
            if time.monotonic() >= end:
                return seen
            self._check()
            time.sleep(POLL_S)

    def _check(self) -> None:
        if not self.probe.running():
            raise WaitTimeoutError(f"the probe exited: {self.probe.log_tail(10)}")
        if self.guard is not None:
            self.guard()

    def describe(self) -> str:
        """The latest view of every daemon, one compact item each."""
        return "; ".join(
            f"{name}@{self.latest[name].t:.2f}: {self.describe_view(self.latest[name])}"
            for name in sorted(self.latest)
        )


class ViewWatch(ProbeWatch[Observation]):
    """The membership view of every daemon (GET /v1/peers through netns_probe.py)."""

    def parse(self, host: str, record: Mapping[str, Any]) -> Observation:
        members = record.get("members")
        return Observation(
            record["t"],
            host,
            None if members is None else {k: (v[0], v[1]) for k, v in members.items()},
            record.get("error"),
        )

    def describe_view(self, view: Observation) -> str:
        if view.members is None:
            return str(view.error)
        return ", ".join(f"{k}={v[0]}/{v[1]}" for k, v in sorted(view.members.items()))

    def wait(
        self,
        condition: Callable[[Mapping[str, Observation]], bool],
        *,
        since: float,
        timeout_s: float,
        message: str,
        hold_s: float = 0.0,
        on_view: Callable[[Observation], None] | None = None,
        on_observation: Callable[[Observation], None] | None = None,
    ) -> float:
        """`ProbeWatch.wait`; `on_observation` is the membership tests' name for `on_view`."""
        return super().wait(
            condition,
            since=since,
            timeout_s=timeout_s,
            message=message,
            hold_s=hold_s,
            on_view=on_view or on_observation,
        )


class Swarm:
    """Daemons on `hosts` of `cluster`, started with `serve_args(host)` added to `shoal serve`.

    Every daemon binds its host's address with the cluster secret in `secret_file`; the probe
    runs on `probe_host` (a host with no daemon, so no partition cuts it off).
    """

    def __init__(
        self,
        cluster: NetnsCluster,
        hosts: Sequence[Host],
        probe_host: Host,
        serve_args: Callable[[Host], Sequence[str]],
        *,
        tree: Path = ROOT,
    ) -> None:
        self.cluster = cluster
        self.tree = tree
        """The checkout whose code the daemons run (another one for a before/after bench)."""
        self.hosts = tuple(hosts)
        self.probe_host = probe_host
        self._serve_args = serve_args
        self.secret_file = cluster.base_dir / "secret"
        self.secret_file.write_text(secrets.token_hex(32) + "\n", encoding="utf-8")
        self.secret_file.chmod(0o600)
        self.daemons: dict[str, ClusterProcess] = {}
        self.down: set[str] = set()
        """Daemons stopped on purpose (`kill`, `terminate`); any other that exits is a failure."""
        self._watch: ViewWatch | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @property
    def watch(self) -> ViewWatch:
        if self._watch is None:
            raise RuntimeError("start_probe() first")
        return self._watch

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def argv(self, host: Host) -> list[str]:
        return [
            sys.executable, "-m", "node", "serve",
            "--bind", host.address,
            "--port", str(host.port),
            "--data-dir", str(host.data_dir),
            "--secret-file", str(self.secret_file),
            *self._serve_args(host),
        ]  # fmt: skip

    def start(self, host: Host) -> ClusterProcess:
        """Start (or restart) the daemon of `host`; returns at once."""
        env = None if self.tree == ROOT else {"PYTHONPATH": str(self.tree)}
        proc = host.spawn(self.argv(host), cwd=self.tree, env=env, name="shoal")
        self.daemons[host.name] = proc
        self.down.discard(host.name)
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL the daemon of host `name` (a crash) and reap it."""
        self.down.add(name)
        self.daemons[name].kill()

    def terminate(self, name: str) -> int:
        """SIGTERM the daemon of host `name`; its exit status (SIGKILL after 10 s)."""
        self.down.add(name)
        return self.daemons[name].terminate()

    def check_daemons(self) -> None:
        """Raise DaemonExitedError when a daemon not stopped on purpose has exited."""
        for name, proc in self.daemons.items():
            if name not in self.down and not proc.running():
                raise DaemonExitedError(
                    f"the daemon on {name} exited with {proc.returncode}:\n{proc.log_tail(20)}"
                )

    def start_all(self, hosts: Iterable[Host] | None = None) -> None:
        for host in self.hosts if hosts is None else hosts:
            self.start(host)

    def start_probe(self, interval_s: float = 0.1, timeout_s: float = 0.5) -> ViewWatch:
        argv = [
            sys.executable, str(PROBE),
            "--secret-file", str(self.secret_file),
            "--interval-s", str(interval_s),
            "--timeout-s", str(timeout_s),
            *(h.endpoint for h in self.hosts),
        ]  # fmt: skip
        proc = self.probe_host.spawn(argv, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, name="probe")
        self._watch = ViewWatch(proc, self.hosts)
        self._watch.guard = self.check_daemons
        return self._watch

    def wait_answering(self, timeout_s: float, names: Iterable[str] | None = None) -> float:
        """Wait until the daemons of `names` (default all) answered; the time the last did."""
        wanted = tuple(self.names if names is None else names)
        watch = self.watch

        def answered(views: Views) -> bool:
            return all(name in watch.first_answer for name in wanted)

        watch.wait(answered, since=0.0, timeout_s=timeout_s, message=f"{wanted} answering")
        return max(watch.first_answer[name] for name in wanted)

    def others(self, name: str) -> tuple[str, ...]:
        return tuple(n for n in self.names if n != name)
