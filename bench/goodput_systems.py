"""The two systems bench/goodput_bench.py runs the same training script under, on the hosts of
one NetnsCluster: shoal (a daemon per host, the script as its training_command, re-forming in
place) and plain torchrun (an agent per host, `--nnodes MIN:MAX --rdzv-backend c10d`, the c10d
store on the first host as torchrun users do, checkpoints in a directory every host shares).

Both take the same faults through the same operations: a host's processes killed (all of them,
as a crash), a worker killed or stopped, a partition, a wiped data dir. What a system cannot
take (torchrun has no GPU health: an Xid) says so, and the fault is scored `n/a`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.goodput_committed import finished_checkpoint, probe_argv, read_probe
from health import FakeGpu, write_fake_gpus
from tests.cluster import ClusterProcess, Host, NetnsCluster

__all__ = ["BenchSettings", "ShoalSystem", "System", "TorchrunSystem", "worker_pids"]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train.py"
RDZV_PORT = 29400


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """What both systems share: the script's step time and save period, the collective
    timeout, shoal's hang timeout, and where progress lines and shared checkpoints go."""

    step_s: float
    save_s: float
    hang_s: float
    collective_s: float
    progress: Path
    shared: Path
    reform: str = "in_place"
    """shoal's training_reform."""


def script_argv(settings: BenchSettings, host: Host) -> list[str]:
    return [
        "--progress", str(settings.progress),
        "--name", host.name,
        "--step-s", f"{settings.step_s:g}",
        "--save-s", f"{settings.save_s:g}",
    ]  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def worker_pids(progress: Path, host: str) -> list[int]:
    """The training processes of `host` still alive, newest first, from their `start` lines."""
    pids: list[int] = []
    for path in sorted(progress.glob(f"{host}-*.jsonl"), key=lambda p: p.stat().st_mtime):
        with contextlib.suppress(ValueError, IndexError):
            pids.append(int(path.stem.rsplit("-", 1)[1]))
    return [pid for pid in reversed(pids) if _alive(pid)]


def namespace_pids(host: Host) -> list[int]:
    assert host.ns is not None
    out = subprocess.run(
        ["ip", "netns", "pids", host.ns], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    return [int(pid) for pid in out.split()]


class System:
    """The operations every system supports; subclasses start their processes."""

    name = "system"

    def __init__(
        self, cluster: NetnsCluster, settings: BenchSettings, hosts: Sequence[Host]
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.hosts = tuple(hosts)
        self.committed: list[tuple[float, int]] = []
        """(unix time, step) each time the newest committed step changed, as the bench saw it."""
        self.restores: list[dict[str, Any]] = []
        """What the system says of its nodes' restores (shoal: the probe's answers)."""
        self.up = {host.name: True for host in self.hosts}
        self.procs: dict[str, ClusterProcess] = {}
        self.notes: list[str] = []

    def start(self) -> None:
        for host in self.hosts:
            self.start_host(host)

    def start_host(self, host: Host) -> None:
        raise NotImplementedError

    def host_down(self, host: Host) -> None:
        """SIGKILL every process of `host` (its daemon or agent, workers, spares)."""
        self.up[host.name] = False
        for pid in namespace_pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc = self.procs.get(host.name)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10.0)

    def host_up(self, host: Host) -> None:
        self.up[host.name] = True
        self.start_host(host)

    def wipe(self, host: Host) -> None:
        """A replaced disk: the host's processes killed, its data dir emptied, the host back."""
        self.host_down(host)
        shutil.rmtree(host.data_dir, ignore_errors=True)
        host.data_dir.mkdir(parents=True)
        self.host_up(host)

    def signal_worker(self, host: Host, signum: signal.Signals) -> int | None:
        """Send `signum` to the newest live training process of `host`; its pid, or None."""
        for pid in worker_pids(self.settings.progress, host.name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
                return pid
        return None

    def xid(self, host: Host, fault: bool) -> bool:
        """Report (or clear) Xid 79 on `host`'s GPU; False when the system cannot see it."""
        return False

    def supervise(self) -> None:
        """Called every second: what an operator's process supervisor would do."""

    def note_committed(self, step: int | None, at: float) -> None:
        if step is not None and (not self.committed or step != self.committed[-1][1]):
            self.committed.append((at, step))

    def collect(self) -> None:
        """Read what the run's end scores beside the progress lines (committed steps)."""

    def close(self) -> None:
        """Stop every process (the cluster's close removes the namespaces too)."""
        for host in self.hosts:
            self.host_down(host)


class ShoalSystem(System):
    """A shoal daemon per host (all voters, role training, gloo, one training process and one
    warm spare, a fake GPU each through the JSON seam, copies of checkpoints asked of nodes
    alive 5 s); a probe on a host of its own reads /v1/training (the committed step, each
    node's last restore)."""

    name = "shoal"

    def __init__(
        self, cluster: NetnsCluster, settings: BenchSettings, hosts: Sequence[Host]
    ) -> None:
        super().__init__(cluster, settings, hosts)
        self.probe: ClusterProcess | None = None
        base = cluster.base_dir
        self.seam = base / "gpus.json"
        self.gpus = [
            FakeGpu(uuid=f"GPU-60d9b0{i:02x}-0000-4000-8000-000000000000")
            for i in range(len(self.hosts))
        ]
        write_fake_gpus(self.seam, self.gpus)
        self.secret = base / "secret"
        self.secret.write_text(secrets.token_hex(32) + "\n", encoding="utf-8")
        self.secret.chmod(0o600)
        self.configs = base / "configs"
        self.configs.mkdir(exist_ok=True)
        names = [host.name for host in self.hosts]
        for index, host in enumerate(self.hosts):
            config = {
                "node_id": host.name,
                "data_dir": str(host.data_dir),
                "bind": host.address,
                "port": host.port,
                "mdns": False,
                "cluster_name": "goodput",
                "voters": names,
                "seeds": [h.endpoint for h in self.hosts if h is not host],
                "role": "training",
                "backend": "gloo",
                "gpus": [index],
                "training_nproc": 1,
                "training_command": [sys.executable, str(SCRIPT), *script_argv(settings, host)],
                "training_env": {"TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"},
                "training_hang_s": settings.hang_s,
                "gpu_fault_check_s": 0.5,
                "gpu_readmit_settle_s": 2.0,
                "gpu_quarantine_limit": 1000,
                "checkpoint_copy_after_s": 5.0,
                "training_spares": 1,
                "training_reform": settings.reform,
                "timeouts": {"collective_s": settings.collective_s, "quorum_s": 60.0},
            }
            (self.configs / f"{host.name}.json").write_text(json.dumps(config), encoding="utf-8")

    def start_host(self, host: Host) -> None:
        env = {
            "SHOAL_CONFIG": str(self.configs / f"{host.name}.json"),
            "SHOAL_SECRET_FILE": str(self.secret),
            "SHOAL_TEST_FAKE_GPUS": str(self.seam),
            "PYTHONPATH": str(ROOT),
        }
        argv = [sys.executable, "-m", "node.cli", "serve"]
        self.procs[host.name] = host.spawn(argv, env=env, cwd=ROOT, name="shoal")

    def start(self) -> None:
        super().start()
        probe_host = next(h for h in self.cluster.hosts if h not in self.hosts)
        argv = probe_argv(self.secret, [host.endpoint for host in self.hosts])
        self.probe = probe_host.spawn(argv, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, name="probe")

    def collect(self) -> None:
        if self.probe is None:
            return
        committed, self.restores = read_probe(self.probe.log_path)
        for at, step in sorted(committed):
            if not self.committed or step > self.committed[-1][1]:
                self.committed.append((at, step))

    def xid(self, host: Host, fault: bool) -> bool:
        index = self.hosts.index(host)
        self.gpus[index] = self.gpus[index].model_copy(update={"xids": (79,) if fault else ()})
        write_fake_gpus(self.seam, self.gpus)
        return True


class TorchrunSystem(System):
    """Plain torchrun on every host: `--nnodes N-1:N --nproc-per-node 1 --rdzv-backend c10d
    --rdzv-endpoint FIRST_HOST:29400 --max-restarts 1000`, torchrun's other defaults; the
    script restores from a checkpoint directory all hosts share (as from NFS). An agent that
    exits on a host that is up is started again within a second (systemd's Restart=always):
    when the first host, which holds the c10d store, dies, every agent fails and restarts."""

    name = "torchrun"

    def agent_argv(self, host: Host) -> list[str]:
        n = len(self.hosts)
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", f"{n - 1}:{n}",
            "--nproc-per-node", "1",
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{self.hosts[0].address}:{RDZV_PORT}",
            "--rdzv-id", "goodput",
            # the first host holds the c10d store: torchrun guesses that from the hostname,
            # which resolves to 127.0.x.1 on these hosts, so it is told
            *(["--rdzv-conf", "is_host=true"] if host is self.hosts[0] else []),
            # and every agent its address (the hostname, the same on every host, would be the
            # workers' MASTER_ADDR)
            "--local-addr", host.address,
            "--max-restarts", "1000",
            str(SCRIPT), *script_argv(self.settings, host),
        ]  # fmt: skip

    def start_host(self, host: Host) -> None:
        env = {
            "SHOAL_CHECKPOINT_DIR": str(self.settings.shared),
            "SHOAL_COLLECTIVE_S": f"{self.settings.collective_s:g}",
            "TORCH_CPP_LOG_LEVEL": "ERROR",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
        }
        self.procs[host.name] = host.spawn(
            self.agent_argv(host), env=env, cwd=host.data_dir, name="torchrun"
        )

    def supervise(self) -> None:
        self.note_committed(finished_checkpoint(self.settings.shared), time.time())
        for host in self.hosts:
            proc = self.procs.get(host.name)
            if self.up[host.name] and proc is not None and not proc.running():
                self.notes.append(f"the torchrun agent on {host.name} exited {proc.returncode}")
                self.start_host(host)


def systems(names: Sequence[str]) -> list[type[System]]:
    known: dict[str, type[System]] = {"shoal": ShoalSystem, "torchrun": TorchrunSystem}
    return [known[name] for name in names]
