"""`shoal dev-cluster`: N nodes on 127.0.0.1 with their own ports and data dirs, a place to try
failures: a node that dies leaves the others running, and `kill` / `restart` act on one node.
On a host with GPUs each node owns a disjoint share of them (node i: GPUs i, i + N, ...).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from config import gpu_share
from net import peer_url
from node.cli.common import EXIT_FAILURE, console, fail

STATE_FILE = "dev-cluster.json"
DEFAULT_DIR = Path(".shoal/dev")
POLL_S = 0.5

dev_app = typer.Typer(
    help="A local cluster on 127.0.0.1 to try shoal and its failures: start it, then kill and "
    "restart single nodes from another terminal while cluster_monitor watches.",
    invoke_without_command=True,
    no_args_is_help=False,
)

DataDirOption = Annotated[Path, typer.Option("--data-dir", help="Parent of every node's data dir.")]


@dataclass(frozen=True)
class DevNode:
    """One node of the dev cluster as the state file records it."""

    name: str
    port: int
    pid: int
    log: str
    gpus: str | None = None
    """The node's `gpus` setting (None: the default, on a host without GPUs)."""
    config: str | None = None
    """The node's config file (`--train`), None without one."""


def config_path(config: Path | None) -> str | None:
    return None if config is None else str(config)


def dev_cluster_name(data_dir: Path) -> str:
    """The cluster name of the dev cluster run from `data_dir`: `dev-` and a short hash of the
    absolute directory, so two dev clusters in two directories never see each other."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()
    return f"dev-{digest[:8]}"


def dev_inventory(nodes: int, base_port: int, cluster: str = "dev") -> str:
    """The inventory `shoal dev-cluster` writes for its loopback nodes of cluster `cluster`."""
    lines = [f"cluster: {{name: {cluster}}}", "hosts:"]
    for index in range(1, nodes + 1):
        lines.append(f"  dev-{index}: {{ssh_host: 127.0.0.1, p2p_port: {base_port + index - 1}}}")
    return "\n".join(lines) + "\n"


def dev_gpus(node_index: int, nodes: int, visible: int) -> str | None:
    """The `gpus` setting of node `node_index` (0-based) of `nodes` on a host with `visible`
    GPUs: its share (config.gpu_share) as `I,J,...`, `none` when the share is empty, None on a
    host without GPUs (nothing changes there)."""
    if visible == 0:
        return None
    share = gpu_share(node_index, nodes, visible)
    return ",".join(map(str, share)) if share else "none"


def host_gpu_count() -> int:
    """How many GPUs NVML sees on this host (0 without GPU, driver or library)."""
    from health import GpuReader, HealthError  # NVML only for the commands that spawn nodes

    reader = GpuReader()
    try:
        return len(reader.read())
    except HealthError as exc:
        console.print(f"cannot count this host's GPUs ({exc}); nodes get none", highlight=False)
        return 0
    finally:
        reader.close()


def train_settings(script: Path) -> dict[str, object]:
    """The settings `--train` gives every node: role training, gloo, one training process
    running `script` (examples/train.py: a small model, a step of 0.2 s, a save every 10 s)
    and one warm spare for its restarts."""
    return {
        "role": "training",
        "backend": "gloo",
        "training_nproc": 1,
        "training_spares": 1,
        "training_command": [sys.executable, str(script), "--step-s", "0.2", "--save-s", "10"],
        "training_env": {"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"},
    }


def train_script() -> Path:
    """examples/train.py of this checkout; exits 1 where shoal runs from an installed wheel
    (the examples live in the source tree)."""
    script = Path(__file__).resolve().parents[2] / "examples" / "train.py"
    if not script.is_file():
        fail(f"{script}: no example training script here (run --train from a shoal checkout)", 1)
    return script


def write_train_config(data_dir: Path, name: str, script: Path) -> Path:
    """The config file of node `name` under `--train` (JSON, which YAML reads)."""
    path = data_dir / f"{name}.train.json"
    path.write_text(json.dumps(train_settings(script), indent=2) + "\n", encoding="utf-8")
    return path


def _node_command(
    data_dir: Path, name: str, port: int, gpus: str | None, config: Path | None = None
) -> list[str]:
    return [
        sys.executable, "-m", "node", "serve",
        "--node-id", name,
        "--port", str(port),
        "--data-dir", str(data_dir / name),
        "--inventory", str(data_dir / "hosts.yaml"),
        *(["--gpus", gpus] if gpus is not None else []),
        *(["--config", str(config)] if config is not None else []),
    ]  # fmt: skip


def _spawn(
    data_dir: Path, name: str, port: int, gpus: str | None, config: Path | None = None
) -> tuple[DevNode, subprocess.Popen[bytes]]:
    log_path = data_dir / f"{name}.log"
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            _node_command(data_dir, name, port, gpus, config),
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # Ctrl-C reaches the dev cluster, which stops the nodes
        )
    return DevNode(name, port, process.pid, str(log_path), gpus, config_path(config)), process


def _write_state(data_dir: Path, nodes: dict[str, DevNode]) -> None:
    path = data_dir / STATE_FILE
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps({"nodes": [asdict(n) for n in nodes.values()]}, indent=2) + "\n")
    temp.replace(path)


def read_state(data_dir: Path) -> dict[str, DevNode]:
    """The nodes of the dev cluster running from `data_dir`; exits 1 when there is none."""
    path = data_dir / STATE_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        fail(f"{path}: no dev cluster runs from {data_dir} (start one: shoal dev-cluster)", 1)
    except (OSError, ValueError) as exc:
        fail(f"{path}: cannot read the dev cluster's state: {exc}", EXIT_FAILURE)
    return {entry["name"]: DevNode(**entry) for entry in document["nodes"]}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _node_named(nodes: dict[str, DevNode], name: str) -> DevNode:
    if name not in nodes:
        fail(f"no node {name!r} in the dev cluster (nodes: {', '.join(sorted(nodes))})")
    return nodes[name]


@dev_app.callback()
def dev_cluster(
    ctx: typer.Context,
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=64, help="How many nodes.")] = 3,
    base_port: Annotated[int, typer.Option("--base-port", help="Port of the first node.")] = 8770,
    data_dir: DataDirOption = DEFAULT_DIR,
    train: Annotated[
        bool,
        typer.Option("--train", help="Every node trains examples/train.py (role training, gloo)."),
    ] = False,
) -> None:
    """Start N nodes on 127.0.0.1 (own ports and data dirs); Ctrl-C stops them all.

    With `--train` every node takes the training role and runs examples/train.py (gloo, one
    process per node): `cluster_monitor` and `shoal training` show the group; kill a node and
    the others re-form and resume from the step the cluster committed.

    A node that dies is reported and the others keep running; `shoal dev-cluster kill NODE` and
    `shoal dev-cluster restart NODE` (from another terminal) act on one node. On a host with G
    GPUs node i owns GPUs i, i + N, ... (`--gpus`), so no two nodes share one.
    """
    if ctx.invoked_subcommand is not None:
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    inventory = dev_inventory(nodes, base_port, dev_cluster_name(data_dir))
    (data_dir / "hosts.yaml").write_text(inventory, encoding="utf-8")
    children: list[subprocess.Popen[bytes]] = []
    running: dict[str, DevNode] = {}

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    visible = host_gpu_count()
    script = train_script() if train else None
    try:
        for index in range(1, nodes + 1):
            gpus, name = dev_gpus(index - 1, nodes, visible), f"dev-{index}"
            config = None if script is None else write_train_config(data_dir, name, script)
            node, process = _spawn(data_dir, name, base_port + index - 1, gpus, config)
            running[node.name] = node
            children.append(process)
        _write_state(data_dir, running)
        console.print(f"cluster {dev_cluster_name(data_dir)} from {data_dir}", highlight=False)
        for node in running.values():
            owned = "" if node.gpus is None else f", GPUs {node.gpus}"
            console.print(
                f"{node.name}: {peer_url('127.0.0.1', node.port)}  (log {node.log}{owned})",
                highlight=False,
            )
        console.print(
            "press Ctrl-C to stop every node; from another terminal try "
            f"`shoal dev-cluster kill dev-1 --data-dir {data_dir}` and watch `cluster_monitor "
            f"--node {peer_url('127.0.0.1', base_port + 1)} --watch`",
            highlight=False,
        )
        if script is not None:
            console.print(
                f"every node trains {script}: `shoal training --node "
                f"{peer_url('127.0.0.1', base_port)}` shows the group, its committed step and "
                "each node's restore",
                highlight=False,
            )
        _watch(data_dir, children)
    except KeyboardInterrupt:
        console.print("stopping...", highlight=False)
    finally:
        _stop_all(data_dir, children)


def _watch(data_dir: Path, children: list[subprocess.Popen[bytes]]) -> None:
    """Report nodes that die or come back until every node is gone or Ctrl-C."""
    reported: set[tuple[str, int]] = set()
    while True:
        for child in children:
            child.poll()  # reap our own children so a killed node is no zombie
        nodes = read_state(data_dir)
        alive = [n for n in nodes.values() if _alive(n.pid)]
        for node in nodes.values():
            if node in alive or (node.name, node.pid) in reported:
                continue
            reported.add((node.name, node.pid))
            console.print(
                f"{node.name} (pid {node.pid}) exited; the other nodes keep running. "
                f"Restart it: shoal dev-cluster restart {node.name} --data-dir {data_dir}",
                highlight=False,
            )
        if not alive:
            fail(f"every node exited; see their logs in {data_dir}", EXIT_FAILURE)
        time.sleep(POLL_S)


def _stop_all(data_dir: Path, children: list[subprocess.Popen[bytes]]) -> None:
    pids = {child.pid for child in children}
    if (data_dir / STATE_FILE).exists():
        pids |= {node.pid for node in read_state(data_dir).values()}
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 12
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    (data_dir / STATE_FILE).unlink(missing_ok=True)


@dev_app.command("kill")
def dev_kill(
    node: Annotated[str, typer.Argument(help="The node, e.g. dev-2.")],
    how: Annotated[
        str, typer.Option("--signal", help="KILL (a crash), TERM (a clean leave) or STOP.")
    ] = "KILL",
    data_dir: DataDirOption = DEFAULT_DIR,
) -> None:
    """Send a signal to one node of the running dev cluster (default SIGKILL, a crash)."""
    try:
        signum = signal.Signals[f"SIG{how.upper().removeprefix('SIG')}"]
    except KeyError:
        fail(f"--signal: unknown signal {how!r} (use KILL, TERM, STOP or CONT)")
    target = _node_named(read_state(data_dir), node)
    if not _alive(target.pid):
        fail(f"{node} (pid {target.pid}) is not running; restart it with dev-cluster restart", 1)
    os.kill(target.pid, signum)
    console.print(f"sent SIG{signum.name.removeprefix('SIG')} to {node} (pid {target.pid})")


@dev_app.command("restart")
def dev_restart(
    node: Annotated[str, typer.Argument(help="The node, e.g. dev-2.")],
    data_dir: DataDirOption = DEFAULT_DIR,
) -> None:
    """Start one node of the running dev cluster again (stopping it first if it still runs)."""
    nodes = read_state(data_dir)
    target = _node_named(nodes, node)
    if _alive(target.pid):
        os.kill(target.pid, signal.SIGTERM)
        deadline = time.monotonic() + 12
        while _alive(target.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(target.pid):
            os.kill(target.pid, signal.SIGKILL)
    config = None if target.config is None else Path(target.config)
    fresh, _ = _spawn(data_dir, node, target.port, target.gpus, config)
    nodes[node] = fresh
    _write_state(data_dir, nodes)
    console.print(f"{node} restarted (pid {fresh.pid}) on {peer_url('127.0.0.1', fresh.port)}")


def register(app: typer.Typer) -> None:
    """Add `shoal dev-cluster` to the app."""
    app.add_typer(dev_app, name="dev-cluster")
