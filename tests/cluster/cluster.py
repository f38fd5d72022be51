"""Hosts and clusters of hosts that run shoal processes; the loopback (no root) cluster."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from tests.cluster import cleanup
from tests.cluster.process import ClusterProcess

__all__ = [
    "Cluster",
    "HarnessError",
    "Host",
    "LoopbackCluster",
    "PartitionUnsupportedError",
    "free_port",
]


class HarnessError(RuntimeError):
    """The harness could not do what a test asked (set up hosts, spawn, partition)."""


class PartitionUnsupportedError(HarnessError):
    """Partitions need network namespaces; the loopback cluster cannot cut links."""


def free_port(address: str = "127.0.0.1") -> int:
    """A port free for both TCP and UDP on `address` (IPv4 or IPv6) right now (shoal uses both
    on one port)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for _ in range(50):
        with socket.socket(family, socket.SOCK_STREAM) as tcp:
            tcp.bind((address, 0))
            port: int = tcp.getsockname()[1]
            with socket.socket(family, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((address, port))
                except OSError:
                    continue
                return port
    raise HarnessError(f"no port free for both TCP and UDP on {address}")


@dataclass(frozen=True)
class Host:
    """One host of a cluster: where its daemon listens and keeps its data.

    `ns` is the network namespace, None in loopback mode. `port` is the port this host's
    daemon should use: the same on every host of a netns cluster, distinct on loopback.
    """

    name: str
    address: str
    port: int
    data_dir: Path
    ns: str | None
    cluster: Cluster = field(repr=False, compare=False)

    @property
    def endpoint(self) -> str:
        """`address:port` of this host's daemon, as peers and seeds name it (`[v6]:port`)."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` wrapped to run on this host (inside its namespace in netns mode)."""
        if self.ns is None:
            return list(argv)
        return ["ip", "netns", "exec", self.ns, *argv]

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
        name: str | None = None,
    ) -> ClusterProcess:
        """Start `argv` on this host in a process group of its own; returns at once.

        `env` is merged over the harness's environment (plus PYTHONUNBUFFERED=1). Output goes to
        `log_path`, by default `<cluster.log_dir>/<host>-<n>-<name>.log`. The cluster kills the
        process when it closes.
        """
        return self.cluster._spawn(self, argv, env=env, log_path=log_path, cwd=cwd, name=name)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float = 30.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on this host to completion and capture its output as text.

        With `check`, a non-zero exit raises `HarnessError` carrying the command's output;
        `subprocess.TimeoutExpired` after `timeout_s` (the command is killed).
        """
        full_env = None if env is None else {**os.environ, **env}
        result = subprocess.run(
            self.command(argv),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=full_env,
            check=False,
        )
        if check and result.returncode != 0:
            raise HarnessError(
                f"{shlex.join(argv)} on {self.name} exited {result.returncode}\n"
                f"stdout: {result.stdout.strip()}\nstderr: {result.stderr.strip()}"
            )
        return result


class Cluster:
    """Hosts that run processes, and the processes they run; closing kills every process.

    Use as a context manager or call `close()` (idempotent). Subclasses create the hosts.
    """

    mode: ClassVar[str] = "abstract"

    def __init__(self, base_dir: Path | None) -> None:
        self._owns_base_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="shoal-cluster-")) if base_dir is None else base_dir
        )
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.base_dir / "logs"
        self.hosts: tuple[Host, ...] = ()
        self.processes: list[ClusterProcess] = []
        self._closed = False
        cleanup.register(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self.hosts)} hosts closed={self._closed}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def _make_host(self, index: int, address: str, port: int, ns: str | None) -> Host:
        name = f"h{index}"
        data_dir = self.base_dir / name
        data_dir.mkdir(parents=True, exist_ok=True)
        return Host(name=name, address=address, port=port, data_dir=data_dir, ns=ns, cluster=self)

    def _spawn(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        log_path: Path | None,
        cwd: Path | None,
        name: str | None,
    ) -> ClusterProcess:
        if self._closed:
            raise HarnessError(f"{self!r} is closed; cannot spawn on {host.name}")
        if log_path is None:
            label = name or Path(argv[0]).name
            log_path = self.log_dir / f"{host.name}-{len(self.processes):02d}-{label}.log"
        proc = ClusterProcess(host, host.command(argv), argv, env=env, log_path=log_path, cwd=cwd)
        self.processes.append(proc)
        return proc

    def kill_all(self) -> None:
        """SIGKILL every process spawned on this cluster and reap it."""
        for proc in self.processes:
            proc.send_signal(signal.SIGKILL)
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout_s=10.0)

    def partition(self, *groups: Sequence[Host]) -> None:
        """Cut every group off from every other group (both directions)."""
        raise PartitionUnsupportedError(self._no_partition())

    def partition_one_way(self, src: Sequence[Host], dst: Sequence[Host]) -> None:
        """Drop only what `src` hosts send to `dst` hosts."""
        raise PartitionUnsupportedError(self._no_partition())

    def heal(self) -> None:
        """Remove every partition."""
        raise PartitionUnsupportedError(self._no_partition())

    def _no_partition(self) -> str:
        return (
            f"{type(self).__name__} cannot partition: processes on 127.0.0.1 share one network; "
            "use the netns_cluster fixture (needs root, iproute2 and nftables)"
        )

    def log_tails(self, lines: int = 40) -> str:
        """The tail of every process log, each under a header naming host, pid and status."""
        parts = []
        for proc in self.processes:
            status = "running" if proc.returncode is None else f"exit {proc.returncode}"
            parts.append(
                f"==== {proc.host.name} pid {proc.pid} ({status}): {shlex.join(proc.argv)}\n"
                f"     log: {proc.log_path}\n{proc.log_tail(lines)}"
            )
        return "\n".join(parts)

    def close(self) -> None:
        """Kill every process and release what the cluster created. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.kill_all()
            self._teardown()
        finally:
            cleanup.unregister(self)
            if self._owns_base_dir:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    def _teardown(self) -> None:
        """Release the cluster's own resources after its processes are dead."""


class LoopbackCluster(Cluster):
    """N hosts that all live on one loopback address (`host`: 127.0.0.1, or `::1` for an IPv6
    cluster), each with its own free port and data directory.

    For runs without root: spawn, signals and logs work as in `NetnsCluster`; partitions raise
    `PartitionUnsupportedError`.
    """

    mode: ClassVar[str] = "loopback"

    def __init__(self, n: int, base_dir: Path | None = None, *, host: str = "127.0.0.1") -> None:
        if n < 1:
            raise ValueError(f"a cluster needs at least one host, got n={n}")
        super().__init__(base_dir)
        ports: list[int] = []
        try:
            while len(ports) < n:
                port = free_port(host)
                if port not in ports:
                    ports.append(port)
        except BaseException:
            self.close()
            raise
        self.hosts = tuple(self._make_host(i, host, port, None) for i, port in enumerate(ports))
